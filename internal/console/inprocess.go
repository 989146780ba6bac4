package console

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"
)

// handlerTransport is an http.RoundTripper that serves each request with
// the server's own handler, in process: the console reaches the API and,
// through the API's proxy, a sandbox's envd the way any client does
// (every rule of the API and the proxy applies), without a connection to
// itself, its TLS certificate or its connection limits.
//
// Responses stream: the handler runs in its own goroutine and the
// response is handed back as soon as it writes its header, so that a
// Connect server stream (a process's output) arrives as it is written.
type handlerTransport struct {
	h http.Handler
	// prepare adjusts each request as the handler sees it (who it comes
	// from, as whom it is authenticated).
	prepare func(*http.Request) *http.Request
	// onPanic is told of a handler's panic.
	onPanic func(v any)
}

// errAborted is what reading a response whose handler panicked returns.
var errAborted = errors.New("the server's handler aborted the response")

func (t handlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancel(req.Context())
	in := req.Clone(ctx)
	in.RequestURI = req.URL.RequestURI()
	in.Host = req.URL.Host
	if in.Body == nil {
		in.Body = http.NoBody
	}
	if in.ContentLength == 0 && in.Body != http.NoBody {
		// A body of unknown length, as a server would see a chunked one.
		in.ContentLength = -1
	}
	in.Proto, in.ProtoMajor, in.ProtoMinor = "HTTP/1.1", 1, 1
	if t.prepare != nil {
		in = t.prepare(in)
	}
	pr, pw := io.Pipe()
	rw := &pipeResponse{header: http.Header{}, body: pw, ready: make(chan struct{})}
	go func() {
		defer func() {
			// As net/http's server does, a handler's panic ends its
			// response, not the process; http.ErrAbortHandler (which
			// ReverseProxy raises when the client has gone) quietly.
			if p := recover(); p != nil {
				err, _ := p.(error)
				if !errors.Is(err, http.ErrAbortHandler) && t.onPanic != nil {
					t.onPanic(p)
				}
				rw.writeHeader(http.StatusBadGateway)
				pw.CloseWithError(errAborted)
				return
			}
			rw.writeHeader(http.StatusOK)
			pw.Close()
		}()
		t.h.ServeHTTP(rw, in)
	}()
	select {
	case <-rw.ready:
	case <-req.Context().Done():
		cancel()
		pr.Close()
		return nil, req.Context().Err()
	}
	res := &http.Response{
		Status:     strconv.Itoa(rw.code) + " " + http.StatusText(rw.code),
		StatusCode: rw.code,
		Proto:      "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        rw.sent,
		Body:          &cancelBody{ReadCloser: pr, cancel: cancel},
		ContentLength: -1,
		Request:       req,
	}
	if n, err := strconv.ParseInt(rw.sent.Get("Content-Length"), 10, 64); err == nil {
		res.ContentLength = n
	}
	return res, nil
}

// cancelBody ends the handler's request when the response body is
// closed, as a client hanging up would.
type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelBody) Close() error {
	b.cancel()
	return b.ReadCloser.Close()
}

// pipeResponse is the http.ResponseWriter handlerTransport hands the
// handler: the header goes out on the first write or flush, the body
// through a pipe the client reads.
type pipeResponse struct {
	header http.Header
	body   *io.PipeWriter

	once  sync.Once
	ready chan struct{}
	code  int
	sent  http.Header
}

func (w *pipeResponse) Header() http.Header { return w.header }

func (w *pipeResponse) WriteHeader(code int) {
	if code >= 100 && code < 200 {
		return // informational: nothing for this client to act on
	}
	w.writeHeader(code)
}

func (w *pipeResponse) writeHeader(code int) {
	w.once.Do(func() {
		w.code = code
		w.sent = w.header.Clone()
		close(w.ready)
	})
}

func (w *pipeResponse) Write(b []byte) (int, error) {
	w.writeHeader(http.StatusOK)
	return w.body.Write(b)
}

// Flush sends the header; the body is unbuffered already.
func (w *pipeResponse) Flush() { w.writeHeader(http.StatusOK) }
