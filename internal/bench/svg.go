package bench

import (
	"bufio"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"strings"
)

// The chart is written by hand rather than with a plotting library: it is
// one kind of bar chart, and a few dozen lines of SVG keep the CLI free of
// a graphics dependency for it.

// Chart geometry, in SVG user units (pixels at 100%).
const (
	svgWidth     = 960
	svgLabelW    = 380 // the operation names on the left
	svgRowH      = 26
	svgTop       = 56
	svgBottom    = 40
	svgBarH      = 16
	svgMinRatioX = 2.0 // the axis reaches at least 2x
)

// WriteSVG draws r's rows as a chart of aenv's p50 against bare runsc's:
// one bar per operation, its length the ratio, with a line at 1x (as fast
// as bare) and each row's two medians beside it. Rows lacking either
// median are left out.
func (r Report) WriteSVG(w io.Writer) error {
	var rows []Row
	maxRatio := svgMinRatioX
	for _, row := range r.Rows {
		if row.RatioP50 > 0 {
			rows = append(rows, row)
			maxRatio = math.Max(maxRatio, row.RatioP50)
		}
	}
	maxRatio = math.Ceil(maxRatio*2) / 2
	height := svgTop + len(rows)*svgRowH + svgBottom
	plotW := float64(svgWidth - svgLabelW - 150)
	x := func(ratio float64) float64 { return float64(svgLabelW) + ratio/maxRatio*plotW }

	bw := bufio.NewWriter(w)
	p := func(format string, args ...any) { fmt.Fprintf(bw, format, args...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		svgWidth, height, svgWidth, height)
	p(`<title>%s</title>`+"\n", esc(fmt.Sprintf("aenv bench: p50 against bare runsc (%d CPUs, template %s)", r.CPUs, r.Template)))
	p(`<rect width="100%%" height="100%%" fill="#fff"/>` + "\n")
	p(`<text x="12" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", esc("aenv / bare runsc, p50 (shorter is faster; the line is as fast as bare)"))
	p(`<text x="12" y="40" fill="#555">%s</text>`+"\n", esc(fmt.Sprintf("%d CPUs, template %s, runsc %s", r.CPUs, r.Template, r.Runsc)))
	// The axis: a tick every half ratio.
	axisY := svgTop + len(rows)*svgRowH
	for t := 0.0; t <= maxRatio+1e-9; t += 0.5 {
		p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x(t), svgTop-6, x(t), axisY)
		p(`<text x="%.1f" y="%d" text-anchor="middle" fill="#555">%s</text>`+"\n", x(t), axisY+16, esc(FormatRatio(t)))
	}
	for i, row := range rows {
		y := svgTop + i*svgRowH
		fill := "#2b7bba" // at or under bare
		if row.RatioP50 > 1 {
			fill = "#d9822b"
		}
		p(`<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", svgLabelW-8, y+13, esc(row.Operation))
		p(`<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"><title>%s</title></rect>`+"\n",
			svgLabelW, y+1, x(row.RatioP50)-float64(svgLabelW), svgBarH, fill,
			esc(fmt.Sprintf("%s: aenv %s, bare %s (%s)", row.Operation, FormatDuration(row.Aenv.P50), FormatDuration(row.Bare.P50), row.Baseline)))
		p(`<text x="%.1f" y="%d">%s</text>`+"\n", x(row.RatioP50)+6, y+13,
			esc(fmt.Sprintf("%s  %s vs %s", FormatRatio(row.RatioP50), FormatDuration(row.Aenv.P50), FormatDuration(row.Bare.P50))))
	}
	p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#333" stroke-width="1.5"/>`+"\n", x(1), svgTop-6, x(1), axisY)
	p("</svg>\n")
	return bw.Flush()
}

// esc escapes s for SVG text and attribute values.
func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}
