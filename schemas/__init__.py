"""Avro schemas of every Mycroft topic, the record types and the wire codec."""
