// Package redistest starts real redis-server processes for tests.
//
// Each call to Start runs its own redis-server child process on a free port of
// 127.0.0.1, with persistence disabled and a private working directory, and
// stops it in t.Cleanup. Tests therefore share no state and never depend on a
// fixed port. The redis-server binary is looked up on PATH; when it is missing
// the test fails (it is never skipped) with a hint to install the Debian
// package redis-server.
//
// The helpers that talk to the server (PING while starting, INFO, CLIENT
// PAUSE, FLUSHALL, SCRIPT FLUSH) use an admin connection of their own. Those
// commands are counted by the server like any other, under their own names
// ("ping", "info", "client|pause", "hello", "client|setinfo", ...), so callers
// of CommandStats should sum only the commands they care about.
package redistest
