package event

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestValidGrantID(t *testing.T) {
	t.Parallel()
	require.True(t, ValidGrantID("gr_0123456789abcdef0123456789abcdef"))
	for _, id := range []string{"", "gr_", "gr_0123456789abcdef0123456789abcde", "gr_0123456789abcdef0123456789abcdef0",
		"gr_0123456789ABCDEF0123456789abcdef", "gr-0123456789abcdef0123456789abcdef", "xx_0123456789abcdef0123456789abcdef",
		"gr_0123456789abcdeg0123456789abcdef", "gr_0123456789abcdef0123456789abcde:"} {
		require.False(t, ValidGrantID(id), id)
	}
}
