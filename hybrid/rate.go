package hybrid

// Limit.Rate is in tokens per second. These helpers turn the way limits are
// usually stated ("100 a minute", "5000 an hour", "1 a day") into that unit,
// in the spirit of rate.Every and redis_rate's PerMinute:
//
//	hybrid.Limit{Name: "signup", Rate: hybrid.PerHour(20), Burst: 5, ...}

// PerSecond returns a rate of n tokens per second: n itself, for limits
// that read alike beside PerMinute and PerHour.
func PerSecond(n float64) float64 { return n }

// PerMinute returns a rate of n tokens per minute in tokens per second
// (n/60).
func PerMinute(n float64) float64 { return n / 60 }

// PerHour returns a rate of n tokens per hour in tokens per second
// (n/3600).
func PerHour(n float64) float64 { return n / 3600 }

// PerDay returns a rate of n tokens per day of 24 hours in tokens per
// second (n/86400).
func PerDay(n float64) float64 { return n / 86400 }
