"""The Parquet sink: batches streamed into one typed Parquet file, safely."""
