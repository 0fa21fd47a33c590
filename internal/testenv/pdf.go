package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// PDFText is the text of a PDF as `pdftotext -layout` (poppler-utils, which make up
// installs) extracts it, one string per page. Without pdftotext the test is skipped, or
// fails where services are required (SkipOrFail).
func PDFText(t testing.TB, pdf []byte) []string {
	t.Helper()
	tool, err := exec.LookPath("pdftotext")
	if err != nil {
		SkipOrFail(t, "pdftotext not found: install poppler-utils (make up does)")
	}
	path := filepath.Join(t.TempDir(), "document.pdf")
	require.NoError(t, os.WriteFile(path, pdf, 0o600))
	out, err := exec.Command(tool, "-layout", "-enc", "UTF-8", path, "-").Output()
	require.NoError(t, err)
	return strings.Split(strings.TrimSuffix(string(out), "\f"), "\f")
}
