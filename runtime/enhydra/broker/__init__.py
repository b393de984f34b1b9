"""A real Apache Kafka broker (KRaft) for development and tests, fetched from Maven Central."""
