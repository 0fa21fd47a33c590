package credit

// VoidMarker exposes the key of a grant's void marker to the tests.
func (s *Store) VoidMarker(g Grant) string { return s.voidMarker(g) }
