package credential

import (
	"crypto/sha256"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNew(t *testing.T) {
	id, secret := New("st_", "mgs_")
	require.Regexp(t, regexp.MustCompile(`^st_[0-9a-f]{16}$`), id)
	require.Regexp(t, regexp.MustCompile(`^mgs_[A-Za-z0-9_-]{43}$`), secret)
	id2, secret2 := New("st_", "mgs_")
	require.NotEqual(t, id, id2)
	require.NotEqual(t, secret, secret2)
	require.True(t, ValidID(id, "st_"))
}

func TestHash(t *testing.T) {
	want := sha256.Sum256([]byte("mgk_abc"))
	require.Equal(t, want[:], Hash("mgk_abc"))
}

func TestValidID(t *testing.T) {
	require.True(t, ValidID("ct_0123456789abcdef", "ct_"))
	for _, id := range []string{"", "ct_", "st_0123456789abcdef", "ct_0123456789ABCDEF", "ct_0123456789abcde",
		"ct_0123456789abcdef0", "ct_0123456789abcde\x00", "ct_0123456789abcdeg", "ct_\xff\xfe3456789abcdef"} {
		require.False(t, ValidID(id, "ct_"), "%q", id)
	}
}
