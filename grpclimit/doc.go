// Package grpclimit applies the limits of a hybrid.Limiter to gRPC servers.
//
// UnaryServerInterceptor and StreamServerInterceptor admit each call against
// one named limit, keyed by a KeyFunc of the call's context and full method
// name (ByMetadata and ByPeerIP are two common ones). A stream is one call:
// it is admitted or refused when it opens, and the messages on it are not
// counted.
//
// A call that is not admitted never reaches the handler. It fails with:
//
//   - codes.ResourceExhausted when the limit denies it. The status carries a
//     google.rpc.RetryInfo detail (errdetails.RetryInfo, read with
//     status.Details) whose retry_delay is how long to wait, and the trailer
//     grpc-retry-pushback-ms holds the same delay in whole milliseconds,
//     rounded up: gRPC clients with a retry policy that lists
//     RESOURCE_EXHAUSTED wait exactly that long before their next attempt
//     (gRFC A6). A denial that waiting cannot turn into an admission (a cost
//     above the limit's burst: hybrid.ErrExceedsBurst, or a wait longer than
//     a day) carries no RetryInfo and the pushback -1, which tells those
//     clients not to retry.
//   - codes.Unavailable, with RetryInfo and pushback as above, when Redis is
//     unreachable and the limit follows its FailClosed outage policy
//     (Decision.Source is hybrid.SourceFailClosed), so that clients can tell
//     an outage from their own excess.
//   - codes.Unavailable when the limiter cannot decide because it is closed
//     (the server is shutting down: another instance may answer) or for a
//     reason this package does not know, and codes.Internal when it cannot
//     decide because the server is misconfigured (an unknown limit name, a
//     cost below 1): retrying cannot help, and retry policies seldom list
//     Internal, where they commonly list Unavailable.
//   - codes.Canceled or codes.DeadlineExceeded when the call's context ends
//     during a decision of a Global limit, as gRPC itself answers.
//   - codes.Unauthenticated when the key is empty and WithEmptyKey chose
//     EmptyKeyReject.
//
// Options set the cost of a call (WithCost, 1 by default), methods and
// services left unlimited (WithSkipMethods, for example the health service
// "/grpc.health.v1.Health/") and what an empty key means (WithEmptyKey: by
// default all calls without a key share one bucket).
//
// grpclimit is a module of its own, so that the hybridlimit module does not
// depend on gRPC.
package grpclimit
