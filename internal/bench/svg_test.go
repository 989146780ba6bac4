package bench

import (
	"bytes"
	"encoding/xml"
	"io"
	"strings"
	"testing"
	"time"
)

// TestWriteSVG: the chart is well-formed SVG with one bar per row that
// has both medians, coloured by which side of bare it falls, its labels
// escaped; a row without a bare median is left out.
func TestWriteSVG(t *testing.T) {
	r := Report{CPUs: 2, Template: "base", Runsc: "runsc", Rows: []Row{
		newRow("create to first command, c=1", "runsc run", []time.Duration{60 * time.Millisecond}, []time.Duration{140 * time.Millisecond}),
		newRow("round trip <login shell> & more", "runsc exec", []time.Duration{27 * time.Millisecond}, []time.Duration{9 * time.Millisecond}),
		newRow("no baseline", "-", []time.Duration{time.Millisecond}, nil),
	}}
	var buf bytes.Buffer
	if err := r.WriteSVG(&buf); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(buf.Bytes()))
	var bars []string
	var texts []string
	var inText bool
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("the SVG is not well-formed: %v\n%s", err, buf.String())
		}
		switch tk := tok.(type) {
		case xml.StartElement:
			inText = tk.Name.Local == "text"
			if tk.Name.Local == "rect" {
				for _, a := range tk.Attr {
					if a.Name.Local == "fill" && a.Value != "#fff" {
						bars = append(bars, a.Value)
					}
				}
			}
		case xml.CharData:
			if inText {
				texts = append(texts, string(tk))
			}
		case xml.EndElement:
			inText = false
		}
	}
	if len(bars) != 2 || bars[0] != "#2b7bba" || bars[1] != "#d9822b" {
		t.Fatalf("bars %v: want one under bare (blue) and one over (orange)", bars)
	}
	all := strings.Join(texts, "\n")
	for _, want := range []string{"round trip <login shell> & more", "0.43x", "3.00x", "27.0ms vs 9.00ms"} {
		if !strings.Contains(all, want) {
			t.Errorf("the chart's text lacks %q:\n%s", want, all)
		}
	}
	if strings.Contains(all, "no baseline") {
		t.Error("a row without a bare median was drawn")
	}
}
