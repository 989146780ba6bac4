package gvisor

import (
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"reflect"
	"strconv"
	"testing"
)

// TestServeWireMatchesRunscMain: the driver's requests and replies are
// the JSON that scripts/runsc-main/serve.go decodes and encodes, field
// for field. The two programs cannot share the types: that one builds in
// the gVisor module, which aenv's does not import.
func TestServeWireMatchesRunscMain(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "../../../scripts/runsc-main/serve.go", nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	theirs := map[string][]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok {
			return true
		}
		st, ok := ts.Type.(*ast.StructType)
		if !ok {
			return false
		}
		for _, field := range st.Fields.List {
			tag := ""
			if field.Tag != nil {
				tag, _ = strconv.Unquote(field.Tag.Value)
			}
			for _, name := range field.Names {
				theirs[ts.Name.Name] = append(theirs[ts.Name.Name], name.Name+" "+types.ExprString(field.Type)+" "+tag)
			}
		}
		return false
	})
	for name, v := range map[string]any{"serveRequest": serveRequest{}, "serveReply": serveReply{}} {
		var ours []string
		typ := reflect.TypeOf(v)
		for i := range typ.NumField() {
			fd := typ.Field(i)
			ours = append(ours, fd.Name+" "+fd.Type.String()+" "+string(fd.Tag))
		}
		if !reflect.DeepEqual(ours, theirs[name]) {
			t.Errorf("%s differs from scripts/runsc-main's:\n ours   %q\n theirs %q", name, ours, theirs[name])
		}
	}
}
