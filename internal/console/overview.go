package console

import "net/http"

// overview is the console's first page. TODO(issue 32): being built.
func (c *Console) overview(w http.ResponseWriter, r *http.Request, v *view) {
	v.Title, v.Nav = "Overview", "overview"
	c.fail(w, r, v, http.StatusNotImplemented, "The overview is not built yet.")
}
