package policy

// ListenerPID returns the backend pid of the cache's LISTEN connection, 0 while it is down,
// so tests can cut the connection.
func (c *Cache) ListenerPID() uint32 { return c.listenerPID.Load() }
