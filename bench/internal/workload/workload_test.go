package workload

import (
	"slices"
	"testing"
	"time"
)

func TestExact(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name  string
		rate  float64
		burst int
		at    []time.Duration
		want  []bool
	}{
		{"burst then empty", 10, 2, []time.Duration{0, 0, 0}, []bool{true, true, false}},
		{"refills at rate", 10, 1, []time.Duration{0, 50 * ms, 100 * ms, 150 * ms, 200 * ms}, []bool{true, false, true, false, true}},
		{"never above burst", 1000, 2, []time.Duration{0, time.Second, time.Second, time.Second}, []bool{true, true, true, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Exact(tc.rate, tc.burst, tc.at); !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestArrivalsAreFixedAndSorted(t *testing.T) {
	for _, sc := range Scenarios(QuickTiming()) {
		for _, poisson := range []bool{false, true} {
			a, b := sc.Arrivals(7, poisson), sc.Arrivals(7, poisson)
			total := 0
			for i := range a {
				if !slices.Equal(a[i], b[i]) {
					t.Fatalf("%s: slot %d differs between two calls with one seed", sc.Name, i)
				}
				if !slices.IsSortedFunc(a[i], func(x, y Arrival) int { return cmpDuration(x.At, y.At) }) {
					t.Errorf("%s: slot %d not sorted", sc.Name, i)
				}
				for _, ar := range a[i] {
					if ar.At < 0 || ar.At >= sc.End() || int(ar.Key) >= max(sc.Keys, 1) || ar.Key < 0 {
						t.Fatalf("%s: arrival %+v out of range", sc.Name, ar)
					}
				}
				total += len(a[i])
			}
			want := sc.Demand * sc.End().Seconds()
			if !poisson && (float64(total) < want*0.99 || float64(total) > want*1.01+float64(sc.Instances)) {
				t.Errorf("%s: %d arrivals, want about %.0f", sc.Name, total, want)
			}
		}
	}
}

func TestSkewAndChurn(t *testing.T) {
	scs := Scenarios(QuickTiming())
	find := func(name string) Scenario {
		for _, s := range scs {
			if s.Name == name {
				return s
			}
		}
		t.Fatalf("no scenario %s", name)
		return Scenario{}
	}
	sk := find(Skewed).Arrivals(1, false)
	total := 0
	for _, a := range sk {
		total += len(a)
	}
	if share := float64(len(sk[0])) / float64(total); share < 0.89 || share > 0.91 {
		t.Errorf("skewed: slot 0 has %.3f of the arrivals, want 0.9", share)
	}

	ch := find(Churn)
	var leave, join time.Duration
	for _, e := range ch.Events {
		switch e.Kind {
		case Leave:
			leave = e.At
		case Join:
			join = e.At
		}
	}
	arr := ch.Arrivals(1, false)
	for _, a := range arr[3] {
		if a.At >= leave && a.At < join {
			t.Fatalf("churn: slot 3 has an arrival at %v, while it is down [%v, %v)", a.At, leave, join)
		}
	}
	total = 0
	for _, a := range arr {
		total += len(a)
	}
	if want := ch.Demand * ch.End().Seconds(); float64(total) < want*0.99 {
		t.Errorf("churn: %d arrivals, want about %.0f: the down slot's arrivals must go elsewhere", total, want)
	}
}

func TestKeysAreZipf(t *testing.T) {
	var keys Scenario
	for _, s := range Scenarios(DefaultTiming()) {
		if s.Name == Keys {
			keys = s
		}
	}
	count := map[int32]int{}
	total := 0
	for _, a := range keys.Arrivals(1, false) {
		for _, ar := range a {
			count[ar.Key]++
			total++
		}
	}
	// P(k) ∝ (1+k)^-1.1 over 10 000 keys: the top key takes about 14%,
	// and key 9 about a tenth of that.
	if top := float64(count[0]) / float64(total); top < 0.10 || top > 0.18 {
		t.Errorf("most popular key has %.3f of the arrivals, want about 0.14", top)
	}
	if r := float64(count[9]) / float64(count[0]); r < 0.05 || r > 0.12 {
		t.Errorf("key 9 over key 0 is %.3f, want about 0.08", r)
	}
	if len(count) < 2000 {
		t.Errorf("only %d distinct keys", len(count))
	}
}

func TestReference(t *testing.T) {
	sc := Scenario{Name: "r", Instances: 2, Rate: 10, Burst: 5, Keys: 1, Demand: 100,
		Warmup: time.Second, Measure: 2 * time.Second, Bucket: 100 * time.Millisecond}
	ref := sc.Reference(sc.Arrivals(1, false))
	// Over the measured 2 s the bucket is empty at the start and refills
	// at 10/s: about 20 admitted, of 200 arrivals.
	if ref.Admitted < 19 || ref.Admitted > 21 {
		t.Errorf("reference admits %d in the measured window, want about 20", ref.Admitted)
	}
	if ref.Arrivals != 200 {
		t.Errorf("%d arrivals in the measured window, want 200", ref.Arrivals)
	}
	if len(ref.Series) != 30 {
		t.Errorf("%d buckets, want 30", len(ref.Series))
	}
	sum := 0
	for _, n := range ref.Series {
		sum += n
	}
	if sum != 5+30 && sum != 5+29 && sum != 5+31 {
		t.Errorf("reference admits %d over the run, want burst 5 + about 30", sum)
	}
}
