"""Where findings go: Prometheus, OpenSearch/Elasticsearch, memory."""
