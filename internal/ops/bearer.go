package ops

import (
	"crypto/subtle"
	"strings"
)

// Bearer reports whether the value of an Authorization header (HTTP) or authorization
// metadata entry (gRPC) is "Bearer <token>", the scheme's case aside, compared in constant
// time. An empty token matches nothing.
func Bearer(value, token string) bool {
	const p = "Bearer "
	if len(value) <= len(p) || !strings.EqualFold(value[:len(p)], p) || token == "" {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(value[len(p):]), []byte(token)) == 1
}
