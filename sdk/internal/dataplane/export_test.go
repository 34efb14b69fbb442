package dataplane

import "net/http"

// WaitedForCredit reports whether the response written with w, the
// ResponseWriter Serve handed its handler, has had to wait for credit: a
// piece found too little of it and waited for a Window frame. Exported
// for tests of flow control: while the host grants nothing, that wait
// never ends, so what the handler sent before it is all it sends, and a
// test knows it without waiting to see nothing more arrive.
func WaitedForCredit(w http.ResponseWriter) bool {
	c := w.(*writer).c
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.more != nil
}

// RunsInline reports whether the handler given w runs on its
// connection's reader (Options.Inline) rather than on a worker.
func RunsInline(w http.ResponseWriter) bool { return w.(*writer).c.inline }
