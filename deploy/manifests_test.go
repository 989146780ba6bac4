//go:build linux

// Package deploy holds no code: its tests check what deploy/ ships against
// the binary and the Kubernetes API types. The rendered manifests in
// kubernetes/ (make manifests renders them from helm/aenv) are decoded
// strictly, so a misspelt field fails; the objects the chart promises
// are there; no secret is on a command line; and every flag a container,
// the image's entrypoint or a systemd unit gives aenv is one its command
// has.
package deploy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/aenvhq/aenv/internal/cli"
)

// object is one rendered manifest: its kind and name, the file it came
// from, and its pod template's spec when it has one.
type object struct {
	kind, name, file string
	typed            any
	raw              map[string]any
	pod              *corev1.PodSpec
}

// decodeDir decodes every document of every *.yaml in dir strictly
// against its kind's type (k8s.io/api); custom resources, whose types are
// not there, are kept as maps.
func decodeDir(t *testing.T, dir string) []object {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no manifests in %s (make manifests renders them)", dir)
	}
	var objs []object
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rd := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
		for {
			doc, err := rd.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if len(bytes.TrimSpace(stripComments(doc))) == 0 {
				continue
			}
			o, err := decode(doc)
			if err != nil {
				t.Errorf("%s: %v", filepath.Base(f), err)
				continue
			}
			o.file = filepath.Base(f)
			objs = append(objs, o)
		}
	}
	return objs
}

func stripComments(doc []byte) []byte {
	var out []byte
	for _, l := range bytes.Split(doc, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(l), []byte("#")) {
			out = append(out, l...)
			out = append(out, '\n')
		}
	}
	return out
}

// customKinds are the custom resources the chart may render, by their
// API group: decoded as maps (cert-manager's and prometheus-operator's
// types are not modules of this repository).
var customKinds = map[string]string{
	"ServiceMonitor": "monitoring.coreos.com/v1",
	"Certificate":    "cert-manager.io/v1",
	"Issuer":         "cert-manager.io/v1",
}

func decode(doc []byte) (object, error) {
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := yaml.Unmarshal(doc, &head); err != nil {
		return object{}, err
	}
	o := object{kind: head.Kind, name: head.Metadata.Name}
	if o.name == "" {
		return o, fmt.Errorf("a %s without a name", o.kind)
	}
	var typed any
	switch head.Kind {
	case "Deployment":
		typed = &appsv1.Deployment{}
	case "DaemonSet":
		typed = &appsv1.DaemonSet{}
	case "StatefulSet":
		typed = &appsv1.StatefulSet{}
	case "Service":
		typed = &corev1.Service{}
	case "Secret":
		typed = &corev1.Secret{}
	case "ServiceAccount":
		typed = &corev1.ServiceAccount{}
	case "Role":
		typed = &rbacv1.Role{}
	case "RoleBinding":
		typed = &rbacv1.RoleBinding{}
	case "Job":
		typed = &batchv1.Job{}
	case "CronJob":
		typed = &batchv1.CronJob{}
	case "PodDisruptionBudget":
		typed = &policyv1.PodDisruptionBudget{}
	default:
		if customKinds[head.Kind] != head.APIVersion {
			return o, fmt.Errorf("%s %s: a kind this test does not know (%s): add it", head.Kind, o.name, head.APIVersion)
		}
		if err := yaml.Unmarshal(doc, &o.raw); err != nil {
			return o, err
		}
		return o, nil
	}
	// Strict: a field the type has not (a misspelling, a wrong level)
	// fails, as it would be dropped by the API server.
	if err := yaml.UnmarshalStrict(doc, typed); err != nil {
		return o, fmt.Errorf("%s %s: %w", head.Kind, o.name, err)
	}
	o.typed = typed
	switch v := typed.(type) {
	case *appsv1.Deployment:
		o.pod = &v.Spec.Template.Spec
	case *appsv1.DaemonSet:
		o.pod = &v.Spec.Template.Spec
	case *appsv1.StatefulSet:
		o.pod = &v.Spec.Template.Spec
	case *batchv1.Job:
		o.pod = &v.Spec.Template.Spec
	case *batchv1.CronJob:
		o.pod = &v.Spec.JobTemplate.Spec.Template.Spec
	}
	return o, nil
}

// renderedDirs are the directories of rendered manifests to check: the
// committed ones, and those AENV_RENDERED_DIRS names (make
// check-manifests renders the chart with other value sets there).
func renderedDirs() []string {
	dirs := []string{"kubernetes"}
	for _, d := range filepath.SplitList(os.Getenv("AENV_RENDERED_DIRS")) {
		if d != "" {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

func find(objs []object, kind, suffix string) *object {
	for i := range objs {
		if objs[i].kind == kind && strings.HasSuffix(objs[i].name, suffix) {
			return &objs[i]
		}
	}
	return nil
}

func container(t *testing.T, o *object, name string) corev1.Container {
	t.Helper()
	for _, c := range o.pod.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("%s %s has no container %s", o.kind, o.name, name)
	return corev1.Container{}
}

// TestManifestsHoldTheCluster: the committed manifests are the cluster the
// chart describes (issue 20, item 3).
func TestManifestsHoldTheCluster(t *testing.T) {
	objs := decodeDir(t, "kubernetes")

	srv := find(objs, "Deployment", "-server")
	if srv == nil {
		t.Fatal("no server Deployment")
	}
	d := srv.typed.(*appsv1.Deployment)
	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		t.Errorf("server Deployment: %v replicas, want 2 or more", d.Spec.Replicas)
	}
	sc := container(t, srv, "server")
	if args := append(slices.Clone(sc.Command), sc.Args...); !slices.Contains(args, "--local-node=false") || !slices.Contains(args, "server") {
		t.Errorf("server container runs %q: want aenv server --local-node=false", args)
	}
	if find(objs, "Service", "-server") == nil {
		t.Error("no Service in front of the servers")
	}

	node := find(objs, "DaemonSet", "-node")
	if node == nil {
		t.Fatal("no node DaemonSet")
	}
	nc := container(t, node, "node")
	if nc.SecurityContext == nil || nc.SecurityContext.Privileged == nil || !*nc.SecurityContext.Privileged {
		t.Error("node container is not privileged (runsc needs namespaces, mounts, cgroups, FUSE, loop devices)")
	}
	if !slices.Contains(nc.Args, "--on-stop=drain") {
		t.Errorf("node runs %q: want --on-stop=drain", nc.Args)
	}
	if nc.Lifecycle == nil || nc.Lifecycle.PreStop == nil || nc.Lifecycle.PreStop.Exec == nil {
		t.Error("node container has no preStop hook")
	}
	if g := node.pod.TerminationGracePeriodSeconds; g == nil || *g < 600 {
		t.Errorf("node pods' grace period %v: want at least the agent's 10 minutes of drain", g)
	}
	if _, ok := nc.Resources.Limits[corev1.ResourceMemory]; ok {
		t.Error("node container has a memory limit: it would bound all its sandboxes together")
	}
	hostPaths := map[string]bool{}
	for _, v := range node.pod.Volumes {
		if v.HostPath != nil {
			hostPaths[v.HostPath.Path] = true
		}
	}
	for _, p := range []string{"/var/lib/aenv", "/run/aenv", "/dev"} {
		if !hostPaths[p] {
			t.Errorf("node pods do not mount the host's %s", p)
		}
	}
	pdbFor := func(component string) bool {
		for _, o := range objs {
			if p, ok := o.typed.(*policyv1.PodDisruptionBudget); ok && p.Spec.Selector != nil &&
				p.Spec.Selector.MatchLabels["app.kubernetes.io/component"] == component {
				return true
			}
		}
		return false
	}
	for _, c := range []string{"node", "server", "etcd"} {
		if !pdbFor(c) {
			t.Errorf("no PodDisruptionBudget for the %s pods", c)
		}
	}

	etcd := find(objs, "StatefulSet", "-etcd")
	if etcd == nil {
		t.Fatal("no etcd StatefulSet")
	}
	if r := etcd.typed.(*appsv1.StatefulSet).Spec.Replicas; r == nil || *r != 3 {
		t.Errorf("etcd StatefulSet: %v members, want 3", r)
	}
	if script := strings.Join(container(t, etcd, "etcd").Command, " "); !strings.Contains(script, "aenv etcd") || !strings.Contains(script, "--ca-dir") {
		t.Errorf("etcd members do not run aenv etcd with the cluster's CA (--ca-dir): %q", script)
	}

	if find(objs, "ServiceMonitor", "-server") == nil {
		t.Error("no ServiceMonitor for the servers' /metrics")
	}
	if find(objs, "CronJob", "-join") == nil || find(objs, "Job", "-join") == nil {
		t.Error("no Job and CronJob that keep the node agents' join token")
	}
	for _, o := range objs {
		if o.kind == "Secret" && len(o.typed.(*corev1.Secret).Data)+len(o.typed.(*corev1.Secret).StringData) > 0 {
			t.Errorf("the committed manifests hold Secret %s's values: render with clusterSecrets.create=false", o.name)
		}
	}
}

// secretLooking are values that are secrets wherever they appear.
var secretLooking = regexp.MustCompile(`e2b_[0-9a-f]{16,}|aenvct_[0-9a-f]{16,}|aenvdk1_[A-Za-z0-9_-]{20,}|\b[a-z0-9]{6}\.[a-z0-9]{16}\b`)

// refusedFlags carry secrets: aenv refuses the first three; a join token
// may be given as --token, but the chart and units read it from a file.
var refusedFlags = []string{"--key", "--cluster-token", "--store-secret-key", "--token"}

// secretEnv are variables that hold secrets: never a literal value.
var secretEnv = []string{"AENV_API_KEY", "E2B_API_KEY", "AENV_CLUSTER_TOKEN", "AENV_JOIN_TOKEN", "AENV_DATA_KEY", "AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID"}

// TestRenderedDecode: every object of every rendered value set decodes
// strictly against its Kubernetes API type.
func TestRenderedDecode(t *testing.T) {
	for _, dir := range renderedDirs() {
		if objs := decodeDir(t, dir); len(objs) < 10 {
			t.Errorf("%s: %d objects, want the whole chart", dir, len(objs))
		}
	}
}

// TestNoSecretOnACommandLine: no container is given a secret in its
// command, arguments or literal environment, in any rendered value set.
func TestNoSecretOnACommandLine(t *testing.T) {
	for _, dir := range renderedDirs() {
		for _, o := range decodeDir(t, dir) {
			if o.pod == nil {
				continue
			}
			for _, c := range append(slices.Clone(o.pod.InitContainers), o.pod.Containers...) {
				where := fmt.Sprintf("%s: %s %s, container %s", dir, o.kind, o.name, c.Name)
				line := strings.Join(append(slices.Clone(c.Command), c.Args...), " ")
				if m := secretLooking.FindString(line); m != "" {
					t.Errorf("%s: a secret-looking value on the command line: %.12s...", where, m)
				}
				for _, call := range containerCalls(where, c) {
					for _, f := range call.flags {
						if slices.Contains(refusedFlags, "--"+f) {
							t.Errorf("%s: aenv %s --%s: a secret on the command line", where, strings.Join(call.sub, " "), f)
						}
					}
				}
				for _, e := range c.Env {
					if slices.Contains(secretEnv, e.Name) && e.Value != "" {
						t.Errorf("%s: %s has a literal value; take it from a Secret", where, e.Name)
					}
				}
			}
		}
	}
}

// TestResourceRequests: every container asks for CPU and memory, so that
// the scheduler places it (and a node under pressure keeps it).
func TestResourceRequests(t *testing.T) {
	for _, dir := range renderedDirs() {
		for _, o := range decodeDir(t, dir) {
			if o.pod == nil {
				continue
			}
			for _, c := range o.pod.Containers {
				for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
					if _, ok := c.Resources.Requests[r]; !ok {
						t.Errorf("%s: %s %s, container %s requests no %s", dir, o.kind, o.name, c.Name, r)
					}
				}
			}
		}
	}
}

// aenvCall is one invocation of aenv found somewhere: the subcommand path
// ("server", "cluster join-command") and the flags given.
type aenvCall struct {
	where string
	sub   []string
	flags []string
}

var flagName = regexp.MustCompile(`^--([a-z0-9][a-z0-9-]*)`)

// callOf reads an aenv invocation from its words (after "aenv"): leading
// words that are not flags name the subcommand.
func callOf(where string, words []string) aenvCall {
	c := aenvCall{where: where}
	i := 0
	for ; i < len(words) && !strings.HasPrefix(words[i], "-") && len(c.sub) < 2; i++ {
		w := strings.Trim(words[i], `"'`)
		if !regexp.MustCompile(`^[a-z][a-z-]*$`).MatchString(w) {
			break
		}
		c.sub = append(c.sub, w)
	}
	for ; i < len(words); i++ {
		if m := flagName.FindStringSubmatch(words[i]); m != nil {
			c.flags = append(c.flags, m[1])
		}
	}
	return c
}

// scriptCalls finds `aenv ...` commands in a shell script (a line, with
// its backslash continuations, up to a pipe, redirection or separator).
func scriptCalls(where, script string) []aenvCall {
	script = strings.ReplaceAll(script, "\\\n", " ")
	var calls []aenvCall
	for _, line := range strings.Split(script, "\n") {
		words := strings.Fields(line)
		for i, w := range words {
			if w != "aenv" || (i > 0 && !slices.Contains([]string{"exec", "until", "if", "then", "do", "&&", "||", ";"}, words[i-1])) {
				continue
			}
			var rest []string
			for _, r := range words[i+1:] {
				if strings.ContainsAny(r, "|;>") || r == "&&" || r == "||" {
					break
				}
				rest = append(rest, r)
			}
			calls = append(calls, callOf(where, rest))
		}
	}
	return calls
}

// containerCalls are the aenv invocations of a container: its command
// and arguments, or the scripts it runs with sh -c.
func containerCalls(where string, c corev1.Container) []aenvCall {
	words := append(slices.Clone(c.Command), c.Args...)
	if len(words) > 0 && words[0] == "aenv" {
		return []aenvCall{callOf(where, words[1:])}
	}
	if len(words) >= 3 && words[0] == "sh" && strings.HasPrefix(words[1], "-") && strings.Contains(words[1], "c") {
		return scriptCalls(where, words[2])
	}
	return nil
}

var (
	helpMu    sync.Mutex
	helpFlags = map[string]map[string]bool{}
)

// flagsOf are the flags `aenv SUB --help` lists (the command's and the
// global ones; hidden flags, such as the refused secret flags, are not).
func flagsOf(t *testing.T, sub []string) map[string]bool {
	t.Helper()
	key := strings.Join(sub, " ")
	helpMu.Lock()
	defer helpMu.Unlock()
	if f, ok := helpFlags[key]; ok {
		return f
	}
	var out bytes.Buffer
	code, err := cli.RunWith(context.Background(), append(slices.Clone(sub), "--help"), cli.Options{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &out})
	if err != nil || code != 0 {
		t.Fatalf("aenv %s --help: %d %v\n%s", key, code, err, out.String())
	}
	if !strings.Contains(out.String(), "Usage:\n  aenv "+key) {
		t.Fatalf("aenv %s is not a command:\n%s", key, out.String())
	}
	f := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([a-z0-9-]+)`).FindAllStringSubmatch(out.String(), -1) {
		f[m[1]] = true
	}
	helpFlags[key] = f
	return f
}

func checkCalls(t *testing.T, calls []aenvCall) {
	t.Helper()
	for _, c := range calls {
		if len(c.sub) == 0 {
			t.Errorf("%s: aenv without a command", c.where)
			continue
		}
		known := flagsOf(t, c.sub)
		for _, f := range c.flags {
			if !known[f] {
				t.Errorf("%s: aenv %s has no flag --%s", c.where, strings.Join(c.sub, " "), f)
			}
		}
	}
}

// TestContainerFlags: every flag a rendered container gives aenv is one
// its command has, in every rendered value set.
func TestContainerFlags(t *testing.T) {
	n := 0
	for _, dir := range renderedDirs() {
		for _, o := range decodeDir(t, dir) {
			if o.pod == nil {
				continue
			}
			for _, c := range append(slices.Clone(o.pod.InitContainers), o.pod.Containers...) {
				calls := containerCalls(fmt.Sprintf("%s: %s %s, container %s", dir, o.kind, o.name, c.Name), c)
				n += len(calls)
				checkCalls(t, calls)
			}
		}
	}
	// server, node, two of etcd's (first and later starts), the join
	// token's in the Job and the CronJob.
	if n < 6 {
		t.Errorf("found %d aenv invocations in the manifests, want at least 6", n)
	}
}

// TestEntrypointAndUnitFlags: the image's entrypoint and the systemd
// units' ExecStart lines name real commands and flags.
func TestEntrypointAndUnitFlags(t *testing.T) {
	b, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^ENTRYPOINT\s+\[(.*)\]\s*$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("Dockerfile: no ENTRYPOINT [...]")
	}
	var words []string
	if err := yaml.Unmarshal([]byte("["+string(m[1])+"]"), &words); err != nil || len(words) == 0 || words[0] != "aenv" {
		t.Fatalf("Dockerfile ENTRYPOINT %s: want [\"aenv\", ...] (%v)", m[1], err)
	}
	checkCalls(t, []aenvCall{callOf("Dockerfile ENTRYPOINT", words[1:])})

	for _, unit := range []string{"aenv.service", "aenv-node.service"} {
		b, err := os.ReadFile(unit)
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`(?m)^ExecStart=\S+/aenv (.*)$`).FindSubmatch(b)
		if m == nil {
			t.Fatalf("%s: no ExecStart=.../aenv ...", unit)
		}
		call := callOf(unit, strings.Fields(string(m[1])))
		checkCalls(t, []aenvCall{call})
		if unit == "aenv-node.service" {
			for _, want := range []string{"on-stop", "token-file", "join", "ca-hash"} {
				if !slices.Contains(call.flags, want) {
					t.Errorf("%s: ExecStart has no --%s", unit, want)
				}
			}
			if !bytes.Contains(b, []byte("\nDelegate=yes\n")) || !bytes.Contains(b, []byte("AENV_ON_STOP=drain")) {
				t.Errorf("%s: want Delegate=yes and AENV_ON_STOP=drain by default", unit)
			}
		}
	}
}

// TestCheckCallsFails: the flag check finds a wrong flag, a wrong
// command and a refused secret flag (a test that could not fail would
// prove nothing).
func TestCheckCallsFails(t *testing.T) {
	for _, c := range []corev1.Container{
		{Command: []string{"aenv"}, Args: []string{"server", "--local-nodes=false"}},
		{Command: []string{"sh", "-ec", "exec aenv etcd --name x \\\n  --listen-clients https://1.2.3.4:2379"}},
		{Command: []string{"aenv"}, Args: []string{"node", "--store-secret-key=x"}},
	} {
		calls := containerCalls("test", c)
		if len(calls) != 1 {
			t.Fatalf("%q: found %d calls", c.Command, len(calls))
		}
		known := flagsOf(t, calls[0].sub)
		bad := false
		for _, f := range calls[0].flags {
			bad = bad || !known[f]
		}
		if !bad {
			t.Errorf("%q %q: the check found nothing wrong", c.Command, c.Args)
		}
	}
	if m := secretLooking.FindString("--token abcdef.0123456789abcdef"); m == "" {
		t.Error("a join token on a command line is not seen")
	}
}
