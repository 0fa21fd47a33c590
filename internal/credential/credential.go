// Package credential makes the credentials metergate hands out once and keeps only as a
// hash: API keys, staff tokens, customer tokens.
package credential

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"strings"
)

// New returns a new credential: an id, idPrefix and 16 hex digits (64 random bits), that
// names it in lists and logs, and a secret, secretPrefix and 43 characters of base64url
// (256 random bits), shown once to whom it is for.
func New(idPrefix, secretPrefix string) (id, secret string) {
	var raw [40]byte
	_, _ = rand.Read(raw[:]) // never fails (crypto/rand panics instead)
	return idPrefix + hex.EncodeToString(raw[:8]), secretPrefix + base64.RawURLEncoding.EncodeToString(raw[8:])
}

// Hash is how a secret is stored and looked up: its SHA-256. A secret has 256 random bits,
// so a plain (unsalted, fast) hash is enough, and a lookup by it compares no secret's bytes
// in time that depends on them.
func Hash(secret string) []byte {
	h := sha256.Sum256([]byte(secret))
	return h[:]
}

// ValidID reports whether id has the form New gives with idPrefix: the prefix and 16
// lowercase hex digits. A store answers any other id "not found" without a query: a NUL
// byte or bad UTF-8 from a request's path is an error to PostgreSQL.
func ValidID(id, idPrefix string) bool {
	digits, ok := strings.CutPrefix(id, idPrefix)
	if !ok || len(digits) != 16 {
		return false
	}
	for i := 0; i < len(digits); i++ {
		if c := digits[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
