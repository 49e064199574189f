package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/hybridlimit/hybridlimit/hybrid"
)

// defaultLimits are the limits used without -config: one per outage policy.
// They are the ones in limits.yaml beside this file.
func defaultLimits() []hybrid.Limit {
	return []hybrid.Limit{
		{Name: "api", Rate: 300, Burst: 30, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal},
		{Name: "login", Rate: 20, Burst: 10, Mode: hybrid.Hybrid, OnOutage: hybrid.FailClosed},
		{Name: "search", Rate: 200, Burst: 20, Mode: hybrid.Hybrid, OnOutage: hybrid.FailOpen},
	}
}

// limitFields are the fields of one limit in a limits file, in the order
// messages list them.
var limitFields = []string{"name", "rate", "burst", "mode", "on_outage"}

// exampleLimits is what a limits file looks like, for messages.
const exampleLimits = `limits:
  - name: api
    rate: 300          # requests per second, across all instances
    burst: 30          # requests admitted at once
    mode: hybrid       # local, global or hybrid
    on_outage: fail-local  # fail-local, fail-open or fail-closed`

// loadLimits reads and checks the limits file at path.
func loadLimits(path string) ([]hybrid.Limit, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("limits file: %w", err)
	}
	return parseLimits(path, data)
}

// yamlLine matches the position yaml.v3 puts in its syntax errors.
var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// parseLimits parses a limits file, named file in messages. It reports
// every problem it finds, each as "file:line: what is wrong: what to write
// instead", joined with newlines.
func parseLimits(file string, data []byte) ([]hybrid.Limit, error) {
	var doc yaml.Node
	// Decoded into a yaml.Node, not a struct, so that every message can give
	// the line of the field it is about; unknown fields are found below.
	if err := yaml.NewDecoder(bytes.NewReader(data)).Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s: the file is empty: write a list of limits, for example\n%s", file, exampleLimits)
		}
		hint := ""
		if bytes.ContainsRune(data, '\t') {
			hint = " (YAML indents with spaces, not tabs)"
		}
		if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
			return nil, fmt.Errorf("%s:%s: not valid YAML: %s%s", file, m[1], m[2], hint)
		}
		return nil, fmt.Errorf("%s: not valid YAML: %s%s", file, strings.TrimPrefix(err.Error(), "yaml: "), hint)
	}
	p := &limitsParser{file: file}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	var list *yaml.Node
	switch root.Kind {
	case yaml.SequenceNode:
		list = root
	case yaml.MappingNode:
		for i := 0; i+1 < len(root.Content); i += 2 {
			k, v := root.Content[i], root.Content[i+1]
			if k.Value != "limits" {
				p.errorf(k, "unknown field %q at the top: the file has one field, limits", k.Value)
				continue
			}
			if v.Kind != yaml.SequenceNode {
				p.errorf(v, "limits must be a list of limits, each starting with \"- name:\", for example\n%s", exampleLimits)
				continue
			}
			list = v
		}
		if list == nil && len(p.errs) == 0 {
			p.errorf(root, "no limits: field is missing: write a list of limits, for example\n%s", exampleLimits)
		}
	default:
		p.errorf(root, "expected a list of limits, for example\n%s", exampleLimits)
	}
	var limits []hybrid.Limit
	if list != nil {
		if len(list.Content) == 0 && len(p.errs) == 0 {
			p.errorf(list, "the list of limits is empty: give at least one, for example\n%s", exampleLimits)
		}
		seen := map[string]int{}
		for i, item := range list.Content {
			l, ok := p.limit(i, item)
			if !ok {
				continue
			}
			if first, dup := seen[l.Name]; dup {
				p.errorf(item, "limit %q is defined twice (first on line %d): give each limit its own name", l.Name, first)
				continue
			}
			seen[l.Name] = item.Line
			limits = append(limits, l)
		}
	}
	if len(p.errs) > 0 {
		return nil, errors.Join(p.errs...)
	}
	return limits, nil
}

// limitsParser collects the problems of one limits file.
type limitsParser struct {
	file  string
	errs  []error
	label string // the limit being parsed, for messages
}

// errorf records a problem at n's line.
func (p *limitsParser) errorf(n *yaml.Node, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if p.label != "" {
		msg = p.label + ": " + msg
	}
	p.errs = append(p.errs, fmt.Errorf("%s:%d: %s", p.file, n.Line, msg))
}

// limit parses the i-th item of the list. It reports false if the item had
// problems, which it has recorded.
func (p *limitsParser) limit(i int, item *yaml.Node) (hybrid.Limit, bool) {
	p.label = fmt.Sprintf("limit #%d", i+1)
	defer func() { p.label = "" }()
	if item.Kind != yaml.MappingNode {
		p.errorf(item, "expected a limit with fields %s, for example\n%s", strings.Join(limitFields, ", "), exampleLimits)
		return hybrid.Limit{}, false
	}
	fields := map[string]*yaml.Node{}
	before := len(p.errs)
	for j := 0; j+1 < len(item.Content); j += 2 {
		k, v := item.Content[j], item.Content[j+1]
		if k.Value == "name" && v.Kind == yaml.ScalarNode && v.Value != "" {
			p.label = fmt.Sprintf("limit %q", v.Value)
		}
		if prev, dup := fields[k.Value]; dup {
			p.errorf(k, "%s is given twice (first on line %d): keep one", k.Value, prev.Line)
			continue
		}
		fields[k.Value] = v
	}
	for j := 0; j+1 < len(item.Content); j += 2 {
		k := item.Content[j]
		if !isLimitField(k.Value) {
			p.errorf(k, "unknown field %q: %s", k.Value, suggestField(k.Value))
		}
	}
	var l hybrid.Limit
	if v := p.field(item, fields, "name", "write name: api (the limit's name, also its URL path)"); v != nil {
		switch {
		case v.Value == "metrics" || v.Value == "healthz":
			p.errorf(v, "name %q is taken by the /%s endpoint: choose another name", v.Value, v.Value)
		case !validName(v.Value):
			p.errorf(v, "name %q: write a name of letters, digits, '-' and '_' (it is the limit's URL path and part of its Redis keys)", v.Value)
		default:
			l.Name = v.Value
		}
	}
	if v := p.field(item, fields, "rate", "write rate: 100 (requests per second across all instances)"); v != nil {
		r, err := strconv.ParseFloat(strings.ReplaceAll(v.Value, "_", ""), 64)
		switch {
		case err != nil || math.IsNaN(r) || math.IsInf(r, 0):
			p.errorf(v, "rate is %q, not a number: write a positive number of requests per second, for example rate: 100", v.Value)
		case r <= 0:
			p.errorf(v, "rate is %s: write a positive number of requests per second, for example rate: %s", v.Value, example(-r, 100))
		default:
			l.Rate = r
		}
	}
	if v := p.field(item, fields, "burst", "write burst: 10 (the most requests admitted at once, at least 1)"); v != nil {
		b, err := strconv.Atoi(strings.ReplaceAll(v.Value, "_", ""))
		switch {
		case err != nil:
			p.errorf(v, "burst is %q, not a whole number: write the most requests admitted at once, for example burst: 10", v.Value)
		case b < 1:
			p.errorf(v, "burst is %d: write a whole number of at least 1, for example burst: %s", b, example(float64(-b), 10))
		default:
			l.Burst = b
		}
	}
	if v := p.field(item, fields, "mode", "write mode: hybrid (or local, global)"); v != nil {
		// UnmarshalText ignores case and reads '_' as '-'; a quoted value
		// may also carry spaces.
		// An empty value reads as the unset mode, which New would reject
		// without saying where.
		if err := l.Mode.UnmarshalText([]byte(strings.TrimSpace(v.Value))); err != nil || l.Mode == hybrid.ModeUnset {
			p.errorf(v, "mode %q is not a mode: write mode: hybrid (or local, global)", v.Value)
		}
	}
	guess, others := "fail-local", "fail-open, fail-closed"
	if sensitive(l.Name) {
		guess, others = "fail-closed", "fail-local, fail-open"
	}
	if v := p.field(item, fields, "on_outage", fmt.Sprintf("write on_outage: %s (or %s): what the limit does while Redis is down", guess, others)); v != nil {
		if err := l.OnOutage.UnmarshalText([]byte(strings.TrimSpace(v.Value))); err != nil || l.OnOutage == hybrid.PolicyUnset {
			p.errorf(v, "on_outage %q is not a policy: write on_outage: %s (or %s)", v.Value, guess, others)
		}
	}
	return l, len(p.errs) == before
}

// field returns the scalar value of the named field, or records that it is
// missing (with fix saying what to write) or not a single value, and
// returns nil.
func (p *limitsParser) field(item *yaml.Node, fields map[string]*yaml.Node, name, fix string) *yaml.Node {
	v := fields[name]
	switch {
	case v == nil || (v.Kind == yaml.ScalarNode && v.Tag == "!!null"):
		at := item
		if v != nil {
			at = v
		}
		p.errorf(at, "%s is missing: %s", name, fix)
		return nil
	case v.Kind != yaml.ScalarNode:
		p.errorf(v, "%s must be a single value, not a list or a mapping: %s", name, fix)
		return nil
	}
	return v
}

func isLimitField(s string) bool {
	for _, f := range limitFields {
		if s == f {
			return true
		}
	}
	return false
}

// suggestField says what to write instead of the unknown field s.
func suggestField(s string) string {
	best, dist := "", 3
	for _, f := range limitFields {
		if d := editDistance(normalize(s), strings.ReplaceAll(f, "_", "-")); d < dist {
			best, dist = f, d
		}
	}
	if best != "" {
		return fmt.Sprintf("write %s instead (a limit has %s)", best, strings.Join(limitFields, ", "))
	}
	return fmt.Sprintf("remove it (a limit has %s)", strings.Join(limitFields, ", "))
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// normalize lower-cases s and reads '_' as '-', so that suggestField finds
// on_outage for On-Outage.
func normalize(s string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimSpace(s)), "_", "-")
}

// validName reports whether s can name a limit: it is a URL path segment
// and part of Redis keys.
func validName(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// sensitive reports whether a limit's name suggests it guards credentials,
// where failing closed is the usual choice.
func sensitive(name string) bool {
	n := strings.ToLower(name)
	for _, w := range []string{"login", "auth", "password", "signin", "sign-in", "otp", "reset", "token"} {
		if strings.Contains(n, w) {
			return true
		}
	}
	return false
}

// example formats v for a message, or def when v is zero.
func example(v, def float64) string {
	if v == 0 {
		v = def
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
