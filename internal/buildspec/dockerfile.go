// Package buildspec is what a template build is, as written: the
// Dockerfile subset aenv builds (Parse, Dockerfile, Step) and the build
// context a client uploads (UnpackContext, PackContext). It is pure (no
// runtime, no store), so that the API can check and forward a build that
// a node runs with package build.
package buildspec

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode"
)

// ErrInvalid classifies builds that are wrong as written: a bad
// instruction, an unknown FROM, a COPY outside the context.
var ErrInvalid = errors.New("invalid build")

// Kinds of build steps.
const (
	StepRun     = "RUN"
	StepEnv     = "ENV"
	StepArg     = "ARG"
	StepWorkdir = "WORKDIR"
	StepUser    = "USER"
	StepCopy    = "COPY"
	StepCmd     = "CMD"
	StepEntry   = "ENTRYPOINT"
)

// FromKind says what a build's FROM names.
type FromKind int

const (
	// FromAuto is a Dockerfile's FROM: an existing template of that name
	// if there is one, else an OCI image reference.
	FromAuto FromKind = iota
	// FromTemplate is an existing aenv template.
	FromTemplate
	// FromImage is an OCI image reference, as `aenv pull` takes it.
	FromImage
)

// Step is one instruction of a build.
type Step struct {
	// Kind is one of the Step* constants.
	Kind string
	// Args are the instruction's arguments once split: RUN: the command
	// (one string when Shell) or its argv; ENV: name, value pairs; ARG:
	// name and, when it has one, default; WORKDIR, USER: one value; COPY:
	// sources then destination; CMD, ENTRYPOINT: argv (or one string when
	// Shell).
	Args []string
	// Raw, when set, is the unsplit text of an instruction whose arguments
	// are expanded with the build's variables as the step runs (Dockerfile
	// ENV, ARG, WORKDIR, USER and COPY); Args is then ignored.
	Raw string
	// Shell says a RUN, CMD or ENTRYPOINT command is one string for
	// `/bin/sh -c`.
	Shell bool
	// User, for RUN, runs this step only as that user (E2B's per-step
	// user); empty means the build's current USER.
	User string
	// Chown, for COPY, owns the copied files ("user[:group]"); empty means
	// root.
	Chown string
	// Chmod, for COPY, sets the mode of the copied regular files (octal,
	// as chmod takes it); empty keeps theirs.
	Chmod string
	// Context, for COPY, replaces Options.ContextDir for this step (files
	// uploaded for it through the API).
	Context string
	// Line is the step's line in its Dockerfile (0 when it came from
	// elsewhere).
	Line int
}

// String gives the step as a Dockerfile line, for logs and errors.
func (s Step) String() string {
	if s.Raw != "" {
		return s.Kind + " " + s.Raw
	}
	switch {
	case s.Shell && len(s.Args) == 1:
		return s.Kind + " " + s.Args[0]
	case s.Kind == StepRun || s.Kind == StepCmd || s.Kind == StepEntry:
		b, _ := json.Marshal(s.Args)
		return s.Kind + " " + string(b)
	case s.Kind == StepEnv:
		var parts []string
		for i := 0; i+1 < len(s.Args); i += 2 {
			parts = append(parts, s.Args[i]+"="+s.Args[i+1])
		}
		return s.Kind + " " + strings.Join(parts, " ")
	}
	return s.Kind + " " + strings.Join(s.Args, " ")
}

// Dockerfile is a parsed build: where it starts and what it does.
type Dockerfile struct {
	// From names the starting point; FromKind says how to read it.
	From     string
	FromKind FromKind
	// PreArgs are the ARGs declared before FROM (they may be used in FROM
	// only).
	PreArgs []Step
	// FromLine is FROM's line in the Dockerfile.
	FromLine int
	// User and Workdir, when set, replace the FROM's before the first
	// step (E2B's builds start as `user` in /home/user).
	User, Workdir string
	Steps         []Step
}

// ignored instructions change nothing aenv records.
var ignored = map[string]bool{"EXPOSE": true, "LABEL": true, "VOLUME": true, "MAINTAINER": true, "STOPSIGNAL": true}

// Parse reads the Dockerfile subset aenv builds: one FROM, then RUN, ENV,
// ARG, WORKDIR, USER, COPY, CMD and ENTRYPOINT (EXPOSE, LABEL, VOLUME,
// MAINTAINER and STOPSIGNAL are accepted and ignored). Anything else is an
// error naming its line.
func Parse(r io.Reader) (*Dockerfile, error) {
	lines, err := logicalLines(r)
	if err != nil {
		return nil, fmt.Errorf("parsing Dockerfile: %w", err)
	}
	df := &Dockerfile{}
	for _, l := range lines {
		kw, rest, _ := strings.Cut(l.text, " ")
		kw = strings.ToUpper(kw)
		rest = strings.TrimSpace(rest)
		fail := func(format string, a ...any) error {
			return fmt.Errorf("parsing Dockerfile: line %d: %s: %s", l.line, kw, fmt.Sprintf(format, a...))
		}
		if kw != "FROM" && kw != "ARG" && df.From == "" {
			return nil, fail("comes before FROM")
		}
		if rest == "" {
			return nil, fail("needs arguments")
		}
		switch kw {
		case "FROM":
			if df.From != "" {
				return nil, fail("multi-stage builds are not supported")
			}
			f := strings.Fields(rest)
			if strings.HasPrefix(f[0], "--") {
				return nil, fail("flags (%s) are not supported", f[0])
			}
			if len(f) != 1 && !(len(f) == 3 && strings.EqualFold(f[1], "AS")) {
				return nil, fail("expected FROM IMAGE [AS NAME]")
			}
			df.From, df.FromKind, df.FromLine = f[0], FromAuto, l.line
		case "RUN", "CMD", "ENTRYPOINT":
			if strings.HasPrefix(rest, "--") {
				return nil, fail("flags are not supported")
			}
			st := Step{Kind: kw, Line: l.line}
			if argv, ok := JSONArray(rest); ok {
				if len(argv) == 0 {
					return nil, fail("empty command")
				}
				st.Args = argv
			} else {
				st.Args, st.Shell = []string{rest}, true
			}
			df.Steps = append(df.Steps, st)
		case "ARG":
			st := Step{Kind: StepArg, Raw: rest, Line: l.line}
			if df.From == "" {
				df.PreArgs = append(df.PreArgs, st)
			} else {
				df.Steps = append(df.Steps, st)
			}
		case "ENV", "WORKDIR", "USER", "COPY":
			df.Steps = append(df.Steps, Step{Kind: kw, Raw: rest, Line: l.line})
		case "ADD":
			return nil, fail("not supported; use COPY (and RUN curl for URLs)")
		default:
			if ignored[kw] {
				continue
			}
			return nil, fail("unsupported instruction")
		}
	}
	if df.From == "" {
		return nil, fmt.Errorf("parsing Dockerfile: no FROM instruction")
	}
	return df, nil
}

// logicalLine is one instruction with its continuation lines joined.
type logicalLine struct {
	text string
	line int
}

// logicalLines joins backslash-continued lines and drops comments and
// blank lines (comment lines inside a continuation too, as Docker does).
func logicalLines(r io.Reader) ([]logicalLine, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	var out []logicalLine
	var cur strings.Builder
	start, n := 0, 0
	for sc.Scan() {
		n++
		raw := strings.TrimRightFunc(sc.Text(), unicode.IsSpace)
		trimmed := strings.TrimSpace(raw)
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && cur.Len() == 0) {
			continue
		}
		if cur.Len() == 0 {
			start = n
			raw = trimmed
		}
		if strings.HasSuffix(raw, "\\") {
			cur.WriteString(strings.TrimSuffix(raw, "\\"))
			continue
		}
		cur.WriteString(raw)
		out = append(out, logicalLine{text: strings.TrimSpace(cur.String()), line: start})
		cur.Reset()
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, logicalLine{text: s, line: start})
	}
	return out, nil
}

// JSONArray parses the exec form `["a", "b"]`.
func JSONArray(s string) ([]string, bool) {
	if !strings.HasPrefix(s, "[") {
		return nil, false
	}
	var argv []string
	if err := json.Unmarshal([]byte(s), &argv); err != nil {
		return nil, false
	}
	return argv, true
}

// Words splits s the way Docker splits ENV, ARG, WORKDIR, USER and COPY
// arguments: on unquoted white space, with quotes removed, backslash
// escapes, and $NAME, ${NAME}, ${NAME:-default} and ${NAME:+alt} replaced
// through lookup outside single quotes.
func Words(s string, lookup func(string) (string, bool)) ([]string, error) {
	var out []string
	var cur strings.Builder
	inWord := false
	rs := []rune(s)
	for i := 0; i < len(rs); i++ {
		c := rs[i]
		switch {
		case unicode.IsSpace(c):
			if inWord {
				out = append(out, cur.String())
				cur.Reset()
				inWord = false
			}
		case c == '\\':
			inWord = true
			if i+1 < len(rs) {
				i++
				cur.WriteRune(rs[i])
			}
		case c == '\'':
			inWord = true
			j := i + 1
			for j < len(rs) && rs[j] != '\'' {
				j++
			}
			if j == len(rs) {
				return nil, fmt.Errorf("unterminated single quote in %q", s)
			}
			cur.WriteString(string(rs[i+1 : j]))
			i = j
		case c == '"':
			inWord = true
			j := i + 1
			for ; j < len(rs) && rs[j] != '"'; j++ {
				switch {
				case rs[j] == '\\' && j+1 < len(rs) && strings.ContainsRune(`"\$`, rs[j+1]):
					j++
					cur.WriteRune(rs[j])
				case rs[j] == '$':
					n, v, err := expandAt(rs, j, lookup)
					if err != nil {
						return nil, err
					}
					cur.WriteString(v)
					j += n - 1
				default:
					cur.WriteRune(rs[j])
				}
			}
			if j == len(rs) {
				return nil, fmt.Errorf("unterminated double quote in %q", s)
			}
			i = j
		case c == '$':
			inWord = true
			n, v, err := expandAt(rs, i, lookup)
			if err != nil {
				return nil, err
			}
			cur.WriteString(v)
			i += n - 1
		default:
			inWord = true
			cur.WriteRune(c)
		}
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out, nil
}

// expandAt expands the variable reference starting with the '$' at
// rs[i]; it returns how many runes it used and the value.
func expandAt(rs []rune, i int, lookup func(string) (string, bool)) (int, string, error) {
	isName := func(c rune) bool { return c == '_' || unicode.IsLetter(c) || unicode.IsDigit(c) }
	if i+1 < len(rs) && rs[i+1] == '{' {
		end := i + 2
		for end < len(rs) && rs[end] != '}' {
			end++
		}
		if end == len(rs) {
			return 0, "", fmt.Errorf("unterminated ${ in %q", string(rs))
		}
		body := string(rs[i+2 : end])
		n := end - i + 1
		if name, def, ok := strings.Cut(body, ":-"); ok {
			if v, set := lookup(name); set && v != "" {
				return n, v, nil
			}
			return n, def, nil
		}
		if name, alt, ok := strings.Cut(body, ":+"); ok {
			if v, set := lookup(name); set && v != "" {
				return n, alt, nil
			}
			return n, "", nil
		}
		v, _ := lookup(body)
		return n, v, nil
	}
	end := i + 1
	for end < len(rs) && isName(rs[end]) {
		end++
	}
	if end == i+1 {
		return 1, "$", nil
	}
	v, _ := lookup(string(rs[i+1 : end]))
	return end - i, v, nil
}
