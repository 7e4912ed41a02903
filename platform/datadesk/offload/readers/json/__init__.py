"""JSON: where the rows are, and the engines that read them."""
