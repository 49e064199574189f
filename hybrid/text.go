package hybrid

import (
	"encoding"
	"errors"
	"fmt"
	"strings"
)

// ErrInvalidValue is wrapped by the errors of the MarshalText and
// UnmarshalText methods of Mode, Policy and Source: UnmarshalText was given
// a name that is not one of the type's, or MarshalText was called on a value
// out of range.
var ErrInvalidValue = errors.New("hybrid: invalid value")

var (
	_ encoding.TextMarshaler   = Mode(0)
	_ encoding.TextUnmarshaler = (*Mode)(nil)
	_ encoding.TextMarshaler   = Policy(0)
	_ encoding.TextUnmarshaler = (*Policy)(nil)
	_ encoding.TextMarshaler   = Source(0)
	_ encoding.TextUnmarshaler = (*Source)(nil)
)

// MarshalText implements encoding.TextMarshaler. It returns the name String
// gives: local, global or hybrid. A Limit, and so a Status, therefore
// marshals to JSON with, for example, "Mode":"hybrid". ModeUnset marshals
// to the empty text, so that a zero Limit or Status marshals too (and New
// still rejects it); a value out of range is an error wrapping
// ErrInvalidValue.
func (m Mode) MarshalText() ([]byte, error) {
	return marshalName(m, "mode", Local, Hybrid)
}

// UnmarshalText implements encoding.TextUnmarshaler. It accepts the names
// MarshalText writes (local, global or hybrid) in any ASCII case, with '_'
// read as '-', and the empty text as ModeUnset; it does not trim spaces.
// For any other text it returns an error wrapping ErrInvalidValue that
// lists the valid names, and leaves m unchanged.
func (m *Mode) UnmarshalText(text []byte) error {
	return unmarshalName(m, text, "mode", Local, Hybrid)
}

// MarshalText implements encoding.TextMarshaler. It returns the name String
// gives: fail-local, fail-open or fail-closed. A Limit, and so a Status,
// therefore marshals to JSON with, for example, "OnOutage":"fail-closed".
// PolicyUnset marshals to the empty text, so that a zero Limit marshals too
// (and New still rejects it); a value out of range is an error wrapping
// ErrInvalidValue.
func (p Policy) MarshalText() ([]byte, error) {
	return marshalName(p, "policy", FailLocal, FailClosed)
}

// UnmarshalText implements encoding.TextUnmarshaler. It accepts the names
// MarshalText writes (fail-local, fail-open or fail-closed) in any ASCII
// case, with '_' read as '-', so that fail_closed and FAIL-CLOSED both mean
// FailClosed, and the empty text as PolicyUnset; it does not trim spaces. For any other text it returns an
// error wrapping ErrInvalidValue that lists the valid names, and leaves p
// unchanged.
func (p *Policy) UnmarshalText(text []byte) error {
	return unmarshalName(p, text, "policy", FailLocal, FailClosed)
}

// MarshalText implements encoding.TextMarshaler. It returns the name String
// gives, the one the metrics use as their source label: lease, local,
// global, exact, fail_open or fail_closed. The zero Source, that of a Decision
// returned with an error, marshals to the empty text; a value out of range
// is an error wrapping ErrInvalidValue.
func (s Source) MarshalText() ([]byte, error) {
	return marshalName(s, "source", SourceLease, SourceFailClosed)
}

// UnmarshalText implements encoding.TextUnmarshaler. It accepts the names
// MarshalText writes (lease, local, global, exact, fail_open or fail_closed) in any
// ASCII case, with '-' and '_' read alike, and the empty text as the zero
// Source; it does not trim spaces. For any
// other text it returns an error wrapping ErrInvalidValue that lists the
// valid names, and leaves s unchanged.
func (s *Source) UnmarshalText(text []byte) error {
	return unmarshalName(s, text, "source", SourceLease, SourceFailClosed)
}

// enum is a type whose values first..last, and only those, are named by
// String; its zero value means unset.
type enum interface {
	~int
	fmt.Stringer
}

// marshalName returns v's name, the empty text for the zero value, or an
// error if v is outside first..last.
func marshalName[E enum](v E, kind string, first, last E) ([]byte, error) {
	if v == 0 {
		return []byte{}, nil
	}
	if v < first || v > last {
		return nil, fmt.Errorf("%w: %v is out of range and has no name: a %s is %s", ErrInvalidValue, v, kind, names(first, last))
	}
	return []byte(v.String()), nil
}

// unmarshalName sets *v to the value in first..last named by text, or
// returns an error and leaves *v alone.
func unmarshalName[E enum](v *E, text []byte, kind string, first, last E) error {
	if len(text) == 0 {
		*v = 0
		return nil
	}
	for e := first; e <= last; e++ {
		if sameName(text, e.String()) {
			*v = e
			return nil
		}
	}
	return fmt.Errorf("%w: %q is not a %s: want %s", ErrInvalidValue, text, kind, names(first, last))
}

// names lists the names of first..last as "a, b or c".
func names[E enum](first, last E) string {
	var b strings.Builder
	for e := first; e <= last; e++ {
		switch {
		case e == last && e != first:
			b.WriteString(" or ")
		case e != first:
			b.WriteString(", ")
		}
		b.WriteString(e.String())
	}
	return b.String()
}

// sameName reports whether text is name up to ASCII case, reading '_' and
// '-' alike.
func sameName(text []byte, name string) bool {
	if len(text) != len(name) {
		return false
	}
	for i := range len(text) {
		if foldName(text[i]) != foldName(name[i]) {
			return false
		}
	}
	return true
}

// foldName lower-cases an ASCII letter and turns '_' into '-'.
func foldName(c byte) byte {
	switch {
	case 'A' <= c && c <= 'Z':
		return c + ('a' - 'A')
	case c == '_':
		return '-'
	}
	return c
}
