package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// InterpreterPort is the code-interpreter template's HTTP API, which
// @e2b/code-interpreter calls through the proxy.
const InterpreterPort = "49999"

// Execution is what running code in a code-interpreter sandbox gave: its
// main result's text, its streams, and its error, as the SDK's Execution
// holds them.
type Execution struct {
	Text           string
	Stdout, Stderr string
	// ErrorName and ErrorValue are the exception the code raised, if any.
	ErrorName, ErrorValue string
}

// RunCode runs code in the default Python context of code-interpreter
// sandbox id, as the SDK's runCode does: POST /execute on port 49999
// through the proxy, whose answer streams one JSON event a line until
// end_of_execution. An exception in the code is in the Execution, not an
// error; an answer that ends before end_of_execution is an error.
func (c *Client) RunCode(ctx context.Context, id, code, accessToken string) (*Execution, error) {
	body, err := json.Marshal(map[string]string{"code": code})
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.baseURL+"/execute", bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("running code in %s: %w", id, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", InterpreterPort)
	if t := c.token(id, accessToken); t != "" {
		req.Header.Set("X-Access-Token", t)
	}
	resp, err := c.send(req)
	if err != nil {
		return nil, fmt.Errorf("running code in %s: %w", id, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return nil, fmt.Errorf("running code in %s: %w", id, apiErrorFrom(resp))
	}
	var ex Execution
	var out, errOut strings.Builder
	sc := bufio.NewScanner(resp.Body)
	// A result may carry a rendered image, far past the default 64 KiB.
	sc.Buffer(make([]byte, 0, 64<<10), 64<<20)
	for sc.Scan() {
		var ev struct {
			Type         string `json:"type"`
			Text         string `json:"text"`
			IsMainResult bool   `json:"is_main_result"`
			Name         string `json:"name"`
			Value        string `json:"value"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("running code in %s: decoding an event: %w", id, err)
		}
		switch ev.Type {
		case "stdout":
			out.WriteString(ev.Text)
		case "stderr":
			errOut.WriteString(ev.Text)
		case "result":
			if ev.IsMainResult {
				ex.Text = ev.Text
			}
		case "error":
			ex.ErrorName, ex.ErrorValue = ev.Name, ev.Value
		case "end_of_execution":
			ex.Stdout, ex.Stderr = out.String(), errOut.String()
			return &ex, nil
		}
	}
	err = sc.Err()
	if err == nil {
		err = errors.New("the answer ended before end_of_execution")
	}
	return nil, fmt.Errorf("running code in %s: %w", id, err)
}
