// Package limitsfile reads the limits of a hybrid.Limiter from a YAML file,
// so that they can live beside a service's other configuration and be
// reloaded with Limiter.SetLimits while it runs:
//
//	limits:
//	  - name: api
//	    rate: 300          # per second across all instances; or 18000/min, 1/day
//	    burst: 30          # requests admitted at once
//	    mode: hybrid       # local, global or hybrid
//	    on_outage: fail-local  # fail-local, fail-open or fail-closed
//	    shadow: true       # optional: decide and count, but admit everything
//
// A rate is a number of tokens per second, or a number per unit of time:
// 100/s, 6000/min, 5000/h, 1/day. Every field but shadow is required: in
// particular what a limit does while Redis is down is never guessed.
//
// Every problem is reported, each with the file's name, the line it is on,
// what is wrong and what to write instead, so that an operator can fix a
// file in one go. The package is apart from package hybrid so that a
// program that configures its limits in code does not link a YAML parser.
package limitsfile

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/hybridlimit/hybridlimit/hybrid"
)

// ErrInvalid is wrapped by every error Parse and Load return for a file
// whose content is not a valid set of limits.
var ErrInvalid = errors.New("limitsfile: invalid limits file")

// Error is one problem in a limits file. Parse and Load return the
// problems of a file joined (errors.Join): errors.As finds the first, and
// errors.Is(err, ErrInvalid) holds.
type Error struct {
	// File is the name given to Parse, or the path given to Load.
	File string
	// Line is the line the problem is on, from 1; 0 when it is about the
	// whole file (an empty one, or YAML whose parser gives no line).
	Line int
	// Msg says what is wrong and what to write instead.
	Msg string
}

// Error returns "file:line: msg", or "file: msg" without a line.
func (e *Error) Error() string {
	if e.Line == 0 {
		return e.File + ": " + e.Msg
	}
	return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
}

// Unwrap returns ErrInvalid.
func (e *Error) Unwrap() error { return ErrInvalid }

// An Option changes how Parse and Load check a file.
type Option func(*options)

type options struct {
	checkName func(string) error
}

// CheckName adds a rule for limit names to those of package hybrid (not
// empty; no ':', '{' or '}'): a program that serves each limit at a URL
// path, say, may allow only letters and digits. check returns an error
// saying what is wrong with name, which is reported at the name's line as
// `name "<name>": <error>`.
func CheckName(check func(name string) error) Option {
	return func(o *options) { o.checkName = check }
}

// Load reads the limits file at path and parses it as Parse does, naming
// it path in messages. A file that cannot be read is an error wrapping the
// one from os.ReadFile (errors.Is(err, fs.ErrNotExist) for a missing file),
// not ErrInvalid.
func Load(path string, opts ...Option) ([]hybrid.Limit, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("limitsfile: %w", err)
	}
	return Parse(path, data, opts...)
}

// Parse parses the limits file data, named name in messages. The file is
// a mapping with one field, limits, holding a list of limits (or that list
// alone); each limit has the fields name, rate, burst, mode, on_outage and,
// optionally, shadow (see the package documentation); exact_bursts, a
// field of placement version 2, is a problem that says to remove it. A
// rate is a number of tokens per second (1e3 and 1_000 are numbers too) or
// a number per unit: /s, /min (or /m), /h and /day (or /d), the units also
// spelt sec, second, minute, hr, hour and with a plural s, in any case; so
// 6000/min is 100, and 1/day about 1.16e-5, tokens per second. Mode and
// on_outage take the names hybrid.Mode and hybrid.Policy read in
// UnmarshalText. The limits returned are valid for hybrid.New and
// Limiter.SetLimits (Global and Hybrid ones still need a Redis client).
// Otherwise Parse returns every problem it found, each an *Error, joined.
func Parse(name string, data []byte, opts ...Option) ([]hybrid.Limit, error) {
	p := &parser{file: name}
	for _, o := range opts {
		o(&p.opts)
	}
	var doc yaml.Node
	// Decoded into a yaml.Node, not a struct, so that every message can give
	// the line of the field it is about; unknown fields are found below.
	if err := yaml.NewDecoder(bytes.NewReader(data)).Decode(&doc); err != nil {
		return nil, errors.Join(syntaxError(name, data, err))
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	limits := p.limits(p.list(root))
	if len(p.errs) > 0 {
		return nil, errors.Join(p.errs...)
	}
	return limits, nil
}

// syntaxError is the problem of a file yaml.v3 could not decode.
func syntaxError(name string, data []byte, err error) *Error {
	if errors.Is(err, io.EOF) {
		return &Error{File: name, Msg: "the file is empty: write a list of limits, for example\n" + example}
	}
	hint := ""
	if bytes.ContainsRune(data, '\t') {
		hint = " (YAML indents with spaces, not tabs)"
	}
	if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
		line, _ := strconv.Atoi(m[1])
		return &Error{File: name, Line: line, Msg: "not valid YAML: " + m[2] + hint}
	}
	return &Error{File: name, Msg: "not valid YAML: " + strings.TrimPrefix(err.Error(), "yaml: ") + hint}
}

// list returns the list of limits in the document root, or records why
// there is none and returns nil.
func (p *parser) list(root *yaml.Node) *yaml.Node {
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
				p.errorf(v, "limits must be a list of limits, each starting with \"- name:\", for example\n%s", example)
				continue
			}
			list = v
		}
		if list == nil && len(p.errs) == 0 {
			p.errorf(root, "no limits: field is missing: write a list of limits, for example\n%s", example)
		}
	default:
		p.errorf(root, "expected a list of limits, for example\n%s", example)
	}
	return list
}

// limits parses the items of list (none if it is nil), recording their
// problems.
func (p *parser) limits(list *yaml.Node) []hybrid.Limit {
	if list == nil {
		return nil
	}
	if len(list.Content) == 0 && len(p.errs) == 0 {
		p.errorf(list, "the list of limits is empty: give at least one, for example\n%s", example)
	}
	var limits []hybrid.Limit
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
	return limits
}

// fields are the fields of one limit, in the order messages list them.
var fields = []string{"name", "rate", "burst", "mode", "on_outage", "shadow"}

// example is what a limits file looks like, for messages.
const example = `limits:
  - name: api
    rate: 300          # per second across all instances; or 18000/min, 1/day
    burst: 30          # requests admitted at once
    mode: hybrid       # local, global or hybrid
    on_outage: fail-local  # fail-local, fail-open or fail-closed`

// yamlLine matches the position yaml.v3 puts in its syntax errors.
var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// parser collects the problems of one limits file.
type parser struct {
	file  string
	opts  options
	errs  []error
	label string // the limit being parsed, for messages
}

// errorf records a problem at n's line.
func (p *parser) errorf(n *yaml.Node, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if p.label != "" {
		msg = p.label + ": " + msg
	}
	p.errs = append(p.errs, &Error{File: p.file, Line: n.Line, Msg: msg})
}

// limit parses the i-th item of the list. It reports false if the item had
// problems, which it has recorded.
func (p *parser) limit(i int, item *yaml.Node) (hybrid.Limit, bool) {
	p.label = fmt.Sprintf("limit #%d", i+1)
	defer func() { p.label = "" }()
	if item.Kind != yaml.MappingNode {
		p.errorf(item, "expected a limit with fields %s, for example\n%s", strings.Join(fields, ", "), example)
		return hybrid.Limit{}, false
	}
	before := len(p.errs)
	given := p.given(item)
	var l hybrid.Limit
	if v := p.field(item, given, "name", "write name: api (the limit's name in calls, metrics and Redis keys)"); v != nil {
		l.Name = p.name(v)
	}
	if v := p.field(item, given, "rate", "write rate: 100 (requests per second across all instances), or rate: 6000/min"); v != nil {
		l.Rate = p.rate(v)
	}
	if v := p.field(item, given, "burst", "write burst: 10 (the most requests admitted at once, at least 1)"); v != nil {
		l.Burst = p.burst(v)
	}
	p.modes(item, given, &l)
	if v := given["shadow"]; v != nil {
		if v.Kind != yaml.ScalarNode || v.Decode(&l.Shadow) != nil {
			p.errorf(v, "shadow is %q, not true or false: write shadow: true to admit every request and only count what the limit would deny, or leave it out", v.Value)
		}
	}
	return l, len(p.errs) == before
}

// given returns the fields of item by name, recording the fields given
// twice and the unknown ones, and labels messages with the limit's name.
func (p *parser) given(item *yaml.Node) map[string]*yaml.Node {
	given := map[string]*yaml.Node{}
	for j := 0; j+1 < len(item.Content); j += 2 {
		k, v := item.Content[j], item.Content[j+1]
		if k.Value == "name" && v.Kind == yaml.ScalarNode && v.Value != "" {
			p.label = fmt.Sprintf("limit %q", v.Value)
		}
		if prev, dup := given[k.Value]; dup {
			p.errorf(k, "%s is given twice (first on line %d): keep one", k.Value, prev.Line)
			continue
		}
		given[k.Value] = v
	}
	for j := 0; j+1 < len(item.Content); j += 2 {
		k := item.Content[j]
		if k.Value == "exact_bursts" {
			// A field of placement version 2, which had two burst
			// semantics.
			p.errorf(k, "exact_bursts is gone: a hybrid limit now always admits a client's burst whole, wherever it lands; remove the line")
			continue
		}
		if !isField(k.Value) {
			p.errorf(k, "unknown field %q: %s", k.Value, suggestField(k.Value))
		}
	}
	return given
}

// burst parses a burst, recording its problem and returning 0 if it has one.
func (p *parser) burst(v *yaml.Node) int {
	b, err := strconv.Atoi(strings.ReplaceAll(v.Value, "_", ""))
	switch {
	case err != nil:
		p.errorf(v, "burst is %q, not a whole number: write the most requests admitted at once, for example burst: 10", v.Value)
	case b < 1:
		p.errorf(v, "burst is %d: write a whole number of at least 1, for example burst: %s", b, exampleNumber(float64(-b), 10))
	default:
		return b
	}
	return 0
}

// modes parses the mode and on_outage of item into l.
func (p *parser) modes(item *yaml.Node, given map[string]*yaml.Node, l *hybrid.Limit) {
	if v := p.field(item, given, "mode", "write mode: hybrid (or local, global)"); v != nil {
		// UnmarshalText ignores case and reads '_' as '-'; a quoted value
		// may also carry spaces. An empty value reads as the unset mode,
		// which New would reject without saying where.
		if err := l.Mode.UnmarshalText([]byte(strings.TrimSpace(v.Value))); err != nil || l.Mode == hybrid.ModeUnset {
			first, rest := nearest(v.Value, "hybrid", "local", "global")
			p.errorf(v, "mode %q is not a mode: write mode: %s (or %s)", v.Value, first, rest)
		}
	}
	guess, others := "fail-local", "fail-open, fail-closed"
	if sensitive(l.Name) {
		guess, others = "fail-closed", "fail-local, fail-open"
	}
	if v := p.field(item, given, "on_outage", fmt.Sprintf("write on_outage: %s (or %s): what the limit does while Redis is down", guess, others)); v != nil {
		if err := l.OnOutage.UnmarshalText([]byte(strings.TrimSpace(v.Value))); err != nil || l.OnOutage == hybrid.PolicyUnset {
			first, rest := nearest(v.Value, guess, strings.Split(others, ", ")...)
			p.errorf(v, "on_outage %q is not a policy: write on_outage: %s (or %s)", v.Value, first, rest)
		}
	}
}

// field returns the scalar value of the named field, or records that it is
// missing (with fix saying what to write) or not a single value, and
// returns nil.
func (p *parser) field(item *yaml.Node, given map[string]*yaml.Node, name, fix string) *yaml.Node {
	v := given[name]
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

// name checks the limit name in v, and returns it, or "" after recording
// what is wrong.
func (p *parser) name(v *yaml.Node) string {
	n := v.Value
	switch {
	case n == "":
		p.errorf(v, "name is empty: write name: api (the limit's name in calls, metrics and Redis keys)")
	case !utf8.ValidString(n) || strings.ContainsAny(n, ":{}"):
		p.errorf(v, "name %q: a limit's name is part of its Redis keys and may not hold ':', '{' or '}'", n)
	case p.opts.checkName != nil:
		if err := p.opts.checkName(n); err != nil {
			p.errorf(v, "name %q: %v", n, err)
			return ""
		}
		return n
	default:
		return n
	}
	return ""
}

// rate reads the rate in v, in tokens per second, or returns 0 after
// recording what is wrong.
func (p *parser) rate(v *yaml.Node) float64 {
	num, unit, hasUnit := strings.Cut(v.Value, "/")
	num = strings.TrimSpace(num)
	per := 1.0
	if hasUnit {
		u := strings.ToLower(strings.TrimSpace(unit))
		var ok bool
		if per, ok = units[u]; !ok {
			p.errorf(v, "rate is %q: %q is not a unit of time: write a number per s, min, h or day, for example rate: %s/min", v.Value, strings.TrimSpace(unit), orNumber(num, "100"))
			return 0
		}
	}
	r, err := strconv.ParseFloat(strings.ReplaceAll(num, "_", ""), 64)
	switch {
	case err != nil || math.IsNaN(r) || math.IsInf(r, 0):
		p.errorf(v, "rate is %q, not a rate: write a positive number of requests per second, or per min, h or day, for example rate: 100 or rate: 6000/min", v.Value)
		return 0
	case r <= 0:
		p.errorf(v, "rate is %s: write a positive number of requests per second, or per min, h or day, for example rate: %s", v.Value, exampleNumber(-r, 100)+unitSuffix(unit, hasUnit))
		return 0
	}
	r /= per
	if r <= 0 || math.IsInf(r, 0) {
		// A rate so small per day that it rounds to nothing per second.
		p.errorf(v, "rate is %s: too small to count: write a larger rate, for example rate: 1/day", v.Value)
		return 0
	}
	return r
}

// units are the seconds in each unit a rate may be given per.
var units = map[string]float64{
	"s": 1, "sec": 1, "second": 1, "seconds": 1,
	"m": 60, "min": 60, "minute": 60, "minutes": 60,
	"h": 3600, "hr": 3600, "hour": 3600, "hours": 3600,
	"d": 86400, "day": 86400, "days": 86400,
}

// unitSuffix is "/unit" as given, for examples, or "" without one.
func unitSuffix(unit string, has bool) string {
	if !has {
		return ""
	}
	return "/" + strings.TrimSpace(unit)
}

// orNumber is num if it reads as a positive number, else def.
func orNumber(num, def string) string {
	if r, err := strconv.ParseFloat(strings.ReplaceAll(num, "_", ""), 64); err == nil && r > 0 && !math.IsInf(r, 0) {
		return num
	}
	return def
}

func isField(s string) bool {
	for _, f := range fields {
		if s == f {
			return true
		}
	}
	return false
}

// suggestField says what to write instead of the unknown field s.
func suggestField(s string) string {
	best, dist := "", 3
	for _, f := range fields {
		if d := editDistance(normalize(s), strings.ReplaceAll(f, "_", "-")); d < dist {
			best, dist = f, d
		}
	}
	if best != "" {
		return fmt.Sprintf("write %s instead (a limit has %s)", best, strings.Join(fields, ", "))
	}
	return fmt.Sprintf("remove it (a limit has %s)", strings.Join(fields, ", "))
}

// nearest orders the valid values def and others for a message about the
// invalid value typed: the one nearest to it first (by edit distance, also
// against each value without its "fail-" prefix, so that "close" finds
// fail-closed), or def when none is within two edits; the rest joined by
// ", " in their given order.
func nearest(typed, def string, others ...string) (first, rest string) {
	t := normalize(typed)
	all := append([]string{def}, others...)
	best, dist := 0, 3
	for i, v := range all {
		d := min(editDistance(t, v), editDistance(t, strings.TrimPrefix(v, "fail-")))
		if d < dist {
			best, dist = i, d
		}
	}
	first = all[best]
	return first, strings.Join(slices.Delete(all, best, best+1), ", ")
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

// exampleNumber formats v for a message, or def when v is zero.
func exampleNumber(v, def float64) string {
	if v == 0 {
		v = def
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
