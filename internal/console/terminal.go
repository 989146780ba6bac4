package console

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/coder/websocket"

	"github.com/aenvhq/aenv/internal/client"
)

// The terminal's WebSocket protocol. Binary messages carry the terminal's
// bytes both ways (keys in, screen out). Text messages are JSON control
// messages: from the page {"type":"resize","cols":N,"rows":N}; from the
// server {"type":"exit","code":N,"status":"..."} when the shell ends, or
// {"type":"error","message":"..."} when it could not start or broke,
// after which the server closes the socket.
type termControl struct {
	Type    string `json:"type"`
	Cols    int    `json:"cols,omitempty"`
	Rows    int    `json:"rows,omitempty"`
	Code    *int   `json:"code,omitempty"`
	Status  string `json:"status,omitempty"`
	Message string `json:"message,omitempty"`
}

const (
	// maxTerminalMessage bounds one message from the page: a paste of a
	// screenful or two, not a file upload.
	maxTerminalMessage = 1 << 20
	// terminalPing keeps idle sockets open through proxies that drop
	// silent connections, and finds pages that vanished without a close.
	terminalPing = 30 * time.Second
	// terminalKillTimeout bounds ending the shell once the page has gone.
	terminalKillTimeout = 10 * time.Second
	// maxTerminalSide bounds a terminal's columns and rows.
	maxTerminalSide = 1000
)

// terminal answers GET {id}/terminal: a WebSocket to a shell on a PTY in
// the sandbox, started through envd's process service (the CLI's client,
// in process, through the API's proxy). A browser always says where a
// WebSocket's page comes from and SameSite does not cover WebSockets, so
// the Origin must be this server and the session's CSRF token must come
// in the csrf query parameter. Closing the socket (the page) kills the
// shell; the shell ending closes the socket.
func (c *Console) terminal(w http.ResponseWriter, r *http.Request, sc *sandboxCall) {
	if msg := checkOrigin(r); msg != "" {
		writeError(w, http.StatusForbidden, msg)
		return
	}
	if subtle.ConstantTimeCompare([]byte(r.URL.Query().Get("csrf")), []byte(sc.csrf)) != 1 {
		writeError(w, http.StatusForbidden, "missing or wrong CSRF token: the terminal's socket carries it in the csrf query parameter")
		return
	}
	size := client.WindowSize{Cols: 80, Rows: 24}
	if cols, rows, ok := termSize(r.URL.Query().Get("cols"), r.URL.Query().Get("rows")); ok {
		size = client.WindowSize{Cols: cols, Rows: rows}
	}
	if !sc.open(r.Context(), w) {
		return
	}
	// Accept checks the Origin against the Host once more, and answers a
	// request that is no WebSocket handshake with 426.
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer conn.CloseNow()
	conn.SetReadLimit(maxTerminalMessage)
	log := c.log.With("sandbox_id", sc.id, "key_id", sc.key.ID)

	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	out := &socketWriter{ctx: ctx, conn: conn}
	p, err := sc.client.StartProcess(ctx, sc.id, client.ProcessOptions{
		// The shell `aenv connect` opens.
		Cmd:         "/bin/bash",
		Args:        []string{"-l"},
		Envs:        map[string]string{"TERM": "xterm-256color"},
		AccessToken: sc.token,
		PTY:         &size,
		Stdout:      out,
		Stderr:      out,
	})
	if err != nil {
		log.Info("console terminal could not start", "err", err)
		sendControl(ctx, conn, termControl{Type: "error", Message: err.Error()})
		conn.Close(websocket.StatusInternalError, "the shell did not start")
		return
	}
	log.Info("console terminal opened", "pid", p.PID(), "cols", size.Cols, "rows", size.Rows)

	// exited closes when the shell's stream ends, done when the socket
	// has been told.
	exited, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		st, err := p.Wait()
		close(exited)
		if err != nil {
			if ctx.Err() == nil {
				sendControl(ctx, conn, termControl{Type: "error", Message: err.Error()})
				conn.Close(websocket.StatusInternalError, "the shell's stream broke")
			}
			return
		}
		code := st.ExitCode()
		sendControl(ctx, conn, termControl{Type: "exit", Code: &code, Status: st.Status})
		conn.Close(websocket.StatusNormalClosure, "the shell ended")
	}()
	go pingLoop(ctx, conn)

	// Keys and resizes, in order, until the page goes or the shell ends
	// (which closes the socket, ending Read).
	for {
		typ, data, err := conn.Read(ctx)
		if err != nil {
			break
		}
		if typ == websocket.MessageBinary {
			if len(data) > 0 && p.SendInput(ctx, data) != nil {
				break
			}
			continue
		}
		var m termControl
		if json.Unmarshal(data, &m) != nil || m.Type != "resize" {
			continue // unknown control messages are ignored, for later pages
		}
		if cols, rows, ok := termSize(strconv.Itoa(m.Cols), strconv.Itoa(m.Rows)); ok {
			_ = p.Resize(ctx, client.WindowSize{Cols: cols, Rows: rows})
		}
	}
	select {
	case <-exited:
	default:
		// The page went: the shell must not outlive it.
		kctx, kcancel := context.WithTimeout(context.WithoutCancel(ctx), terminalKillTimeout)
		if err := p.Kill(kctx); err != nil {
			log.Info("console terminal: killing the shell", "err", err)
		}
		kcancel()
	}
	cancel()
	<-done
	log.Info("console terminal closed", "pid", p.PID())
}

// termSize parses a terminal's columns and rows; false unless both are
// within 1..maxTerminalSide.
func termSize(cols, rows string) (uint16, uint16, bool) {
	c, err1 := strconv.Atoi(cols)
	r, err2 := strconv.Atoi(rows)
	if err1 != nil || err2 != nil || c < 1 || r < 1 || c > maxTerminalSide || r > maxTerminalSide {
		return 0, 0, false
	}
	return uint16(c), uint16(r), true
}

// socketWriter sends what the shell writes as binary messages.
type socketWriter struct {
	ctx  context.Context
	conn *websocket.Conn
}

func (s *socketWriter) Write(b []byte) (int, error) {
	if err := s.conn.Write(s.ctx, websocket.MessageBinary, b); err != nil {
		return 0, err
	}
	return len(b), nil
}

func sendControl(ctx context.Context, conn *websocket.Conn, m termControl) {
	b, _ := json.Marshal(m)
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_ = conn.Write(wctx, websocket.MessageText, b)
}

// pingLoop pings the page every terminalPing until ctx ends; a page that
// does not answer within one period has gone, and its socket is closed.
func pingLoop(ctx context.Context, conn *websocket.Conn) {
	t := time.NewTicker(terminalPing)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			pctx, cancel := context.WithTimeout(ctx, terminalPing)
			err := conn.Ping(pctx)
			cancel()
			if err != nil && !errors.Is(err, context.Canceled) {
				conn.CloseNow()
				return
			}
		}
	}
}
