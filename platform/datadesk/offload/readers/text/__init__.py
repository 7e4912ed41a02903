"""Tables drawn in text: Markdown, ASCII boxes, psql, fixed-width columns."""
