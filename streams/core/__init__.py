"""The pure detection and root-cause core: no Kafka, Faust or sink imports."""
