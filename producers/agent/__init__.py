"""The node agent: drains ring buffers, batches per tick, publishes durably."""
