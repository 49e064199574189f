package hybrid_test

import (
	"context"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"reflect"
	"strings"
	"testing"

	"github.com/hybridlimit/hybridlimit/hybrid"
)

// textCase is a text UnmarshalText is given and the value it must give, or
// a valid value of zero when it must fail.
type textCase[T any] struct {
	text string
	want T
}

// checkText checks the text methods of one enum type: MarshalText of every
// valid value gives its String and reads back; the cases read as wanted,
// and failing cases leave the value alone and wrap ErrInvalidValue with the
// valid names; the zero value and the empty text stand for each other;
// MarshalText fails for exactly the other values String has no name for.
func checkText[T interface {
	~int
	fmt.Stringer
	encoding.TextMarshaler
}, P interface {
	*T
	encoding.TextUnmarshaler
}](t *testing.T, kind string, valid []T, names string, cases []textCase[T]) {
	t.Helper()
	for _, v := range valid {
		b, err := v.MarshalText()
		if err != nil || string(b) != v.String() {
			t.Errorf("%s(%d).MarshalText() = %q, %v; want %q", kind, int(v), b, err, v.String())
			continue
		}
		var back T
		if err := P(&back).UnmarshalText(b); err != nil || back != v {
			t.Errorf("UnmarshalText(%q) = %v, %v; want %v", b, back, err, v)
		}
	}
	var zero T
	if b, err := zero.MarshalText(); err != nil || len(b) != 0 {
		t.Errorf("%s(0).MarshalText() = %q, %v; want the empty text", kind, b, err)
	}
	if got := T(99); P(&got).UnmarshalText(nil) != nil || got != 0 {
		t.Errorf("UnmarshalText of the empty text = %v; want %s(0)", got, kind)
	}
	for _, tc := range cases {
		got := T(99) // left alone on error
		err := P(&got).UnmarshalText([]byte(tc.text))
		switch {
		case tc.want == 0 && err == nil:
			t.Errorf("UnmarshalText(%q) = %v; want an error", tc.text, got)
		case tc.want == 0:
			if !errors.Is(err, hybrid.ErrInvalidValue) || !strings.Contains(err.Error(), names) {
				t.Errorf("UnmarshalText(%q): error %q; want ErrInvalidValue listing %q", tc.text, err, names)
			}
			if got != 99 {
				t.Errorf("UnmarshalText(%q) failed but changed the value to %v", tc.text, got)
			}
		case err != nil || got != tc.want:
			t.Errorf("UnmarshalText(%q) = %v, %v; want %v", tc.text, got, err, tc.want)
		}
	}
	// The values with a name are exactly those String names: a new
	// constant cannot be added to String and forgotten here.
	for i := -2; i < 12; i++ {
		if i == 0 {
			continue
		}
		v := T(i)
		named := !strings.HasPrefix(v.String(), kind+"(")
		b, err := v.MarshalText()
		switch {
		case named && err != nil:
			t.Errorf("%s(%d) is named %q by String but MarshalText fails: %v", kind, i, v.String(), err)
		case !named && err == nil:
			t.Errorf("%s(%d).MarshalText() = %q; want an error for a value without a name", kind, i, b)
		case !named && (!errors.Is(err, hybrid.ErrInvalidValue) || !strings.Contains(err.Error(), names)):
			t.Errorf("%s(%d).MarshalText(): error %q; want ErrInvalidValue listing %q", kind, i, err, names)
		}
	}
}

// rejected are texts no Mode, Policy or Source has.
var rejected = []string{" ", "0", "1", "unset", "none", "Mode(3)", "Policy(1)", "\xff", "hybrid\x00"}

func TestModeText(t *testing.T) {
	cases := []textCase[hybrid.Mode]{
		{"local", hybrid.Local}, {"global", hybrid.Global}, {"hybrid", hybrid.Hybrid},
		{"LOCAL", hybrid.Local}, {"Global", hybrid.Global}, {"hYbRiD", hybrid.Hybrid},
		{" hybrid", 0}, {"hybrid ", 0}, {"leased", 0}, {"hybrids", 0}, {"hybri", 0},
		{"fail-local", 0}, {"lease", 0},
		{"hybr\u0130d", 0}, // only ASCII letters fold
	}
	for _, s := range rejected {
		cases = append(cases, textCase[hybrid.Mode]{s, 0})
	}
	checkText(t, "Mode", []hybrid.Mode{hybrid.Local, hybrid.Global, hybrid.Hybrid}, "local, global or hybrid", cases)
}

func TestPolicyText(t *testing.T) {
	cases := []textCase[hybrid.Policy]{
		{"fail-local", hybrid.FailLocal}, {"fail-open", hybrid.FailOpen}, {"fail-closed", hybrid.FailClosed},
		// The forms the demo's limits files have always accepted.
		{"fail_local", hybrid.FailLocal}, {"FAIL_OPEN", hybrid.FailOpen}, {"Fail-Closed", hybrid.FailClosed},
		{"fail_closed", hybrid.FailClosed}, {"FAIL-LOCAL", hybrid.FailLocal},
		{"fail-soft", 0}, {"failclosed", 0}, {"FailClosed", 0}, {"fail closed", 0}, {"fail--open", 0},
		{"open", 0}, {"closed", 0}, {"local", 0}, {" fail-open", 0}, {"fail-open\n", 0},
	}
	for _, s := range rejected {
		cases = append(cases, textCase[hybrid.Policy]{s, 0})
	}
	checkText(t, "Policy", []hybrid.Policy{hybrid.FailLocal, hybrid.FailOpen, hybrid.FailClosed},
		"fail-local, fail-open or fail-closed", cases)
}

func TestSourceText(t *testing.T) {
	cases := []textCase[hybrid.Source]{
		{"lease", hybrid.SourceLease}, {"local", hybrid.SourceLocal}, {"global", hybrid.SourceGlobal},
		{"exact", hybrid.SourceExact}, {"fail_open", hybrid.SourceFailOpen}, {"fail_closed", hybrid.SourceFailClosed},
		{"fail-open", hybrid.SourceFailOpen}, {"FAIL-CLOSED", hybrid.SourceFailClosed}, {"Lease", hybrid.SourceLease},
		{"hybrid", 0}, {"fail-local", 0}, {"leases", 0},
	}
	for _, s := range rejected {
		cases = append(cases, textCase[hybrid.Source]{s, 0})
	}
	checkText(t, "Source", []hybrid.Source{hybrid.SourceLease, hybrid.SourceLocal, hybrid.SourceGlobal,
		hybrid.SourceExact, hybrid.SourceFailOpen, hybrid.SourceFailClosed}, "lease, local, global, exact, fail_open or fail_closed", cases)
}

func TestMarshalTextOutOfRangeError(t *testing.T) {
	for _, tc := range []struct {
		v    encoding.TextMarshaler
		want string
	}{
		{hybrid.Mode(4), "hybrid: invalid value: Mode(4) is out of range and has no name: a mode is local, global or hybrid"},
		{hybrid.Policy(7), "hybrid: invalid value: Policy(7) is out of range and has no name: a policy is fail-local, fail-open or fail-closed"},
		{hybrid.Source(-1), "hybrid: invalid value: Source(-1) is out of range and has no name: a source is lease, local, global, exact, fail_open or fail_closed"},
	} {
		if _, err := tc.v.MarshalText(); err == nil || err.Error() != tc.want {
			t.Errorf("%v.MarshalText(): error %v; want %q", tc.v, err, tc.want)
		}
	}
	var m hybrid.Mode
	err := m.UnmarshalText([]byte("leased"))
	if want := `hybrid: invalid value: "leased" is not a mode: want local, global or hybrid`; err == nil || err.Error() != want {
		t.Errorf("UnmarshalText(leased): error %v; want %q", err, want)
	}
}

// TestStatusJSON: a Status, which embeds its Limit, marshals its Mode and
// OnOutage by name, and reads back.
func TestStatusJSON(t *testing.T) {
	l, err := hybrid.New(hybrid.Config{Limits: []hybrid.Limit{
		{Name: "api", Rate: 100, Burst: 20, Mode: hybrid.Local, OnOutage: hybrid.FailClosed},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	st, err := l.Status("api")
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if want := `"Mode":"local","OnOutage":"fail-closed"`; !strings.Contains(string(b), want) {
		t.Errorf("json.Marshal(Status) = %s; want it to contain %s", b, want)
	}
	var back hybrid.Status
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, st) {
		t.Errorf("Status read back as %+v; want %+v", back, st)
	}

	// A zero Status, as returned with an error, marshals with its unset
	// enums empty, and a zero Decision too.
	if b, err := json.Marshal(hybrid.Status{}); err != nil || !strings.Contains(string(b), `"Mode":"","OnOutage":""`) {
		t.Errorf("json.Marshal(Status{}) = %s, %v; want the unset Mode and OnOutage as empty strings", b, err)
	}
	if b, err := json.Marshal(hybrid.Decision{}); err != nil || !strings.Contains(string(b), `"Source":""`) {
		t.Errorf("json.Marshal(Decision{}) = %s, %v; want the zero Source as an empty string", b, err)
	}
}

func TestLimitJSON(t *testing.T) {
	want := hybrid.Limit{Name: "login", Rate: 20, Burst: 10, Mode: hybrid.Hybrid, OnOutage: hybrid.FailClosed}
	b, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	if s := `{"Name":"login","Rate":20,"Burst":10,"Mode":"hybrid","OnOutage":"fail-closed"}`; string(b) != s {
		t.Errorf("json.Marshal(Limit) = %s; want %s", b, s)
	}
	var got hybrid.Limit
	if err := json.Unmarshal([]byte(`{"Name":"login","Rate":20,"Burst":10,"Mode":"Hybrid","OnOutage":"fail_closed"}`), &got); err != nil || got != want {
		t.Errorf("json.Unmarshal = %+v, %v; want %+v", got, err, want)
	}
	for _, s := range []string{
		`{"Mode":"leased"}`,
		`{"OnOutage":"fail-soft"}`,
		`{"Mode":"unset"}`,
	} {
		var l hybrid.Limit
		if err := json.Unmarshal([]byte(s), &l); !errors.Is(err, hybrid.ErrInvalidValue) {
			t.Errorf("json.Unmarshal(%s): error %v; want one wrapping ErrInvalidValue", s, err)
		}
	}
	// Numbers, what a Limit marshalled to before Mode and Policy had names,
	// are not read.
	var l hybrid.Limit
	if err := json.Unmarshal([]byte(`{"Mode":3}`), &l); err == nil {
		t.Errorf("json.Unmarshal of a numeric Mode gave %+v; want an error", l)
	}
}

func ExamplePolicy_UnmarshalText() {
	var p hybrid.Policy
	if err := p.UnmarshalText([]byte("fail_closed")); err != nil {
		log.Fatal(err)
	}
	fmt.Println(p == hybrid.FailClosed, p)

	err := p.UnmarshalText([]byte("fail-soft"))
	fmt.Println(errors.Is(err, hybrid.ErrInvalidValue))
	fmt.Println(err)
	// Output:
	// true fail-closed
	// true
	// hybrid: invalid value: "fail-soft" is not a policy: want fail-local, fail-open or fail-closed
}

func ExampleLimit_json() {
	b, err := json.Marshal(hybrid.Limit{Name: "login", Rate: 20, Burst: 10, Mode: hybrid.Hybrid, OnOutage: hybrid.FailClosed})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(b))

	// An unset Mode is empty, never a valid-looking name.
	b, err = json.Marshal(hybrid.Limit{Name: "login", Rate: 20, Burst: 10, OnOutage: hybrid.FailClosed})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(b))
	// Output:
	// {"Name":"login","Rate":20,"Burst":10,"Mode":"hybrid","OnOutage":"fail-closed"}
	// {"Name":"login","Rate":20,"Burst":10,"Mode":"","OnOutage":"fail-closed"}
}
