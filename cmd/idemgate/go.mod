// No replace directive here: "go install …/cmd/idemgate@version" refuses a
// go.mod that has one. Inside the repository go.work joins this module to
// the library's working tree (docs/releasing.md).
module github.com/idemgate/idemgate/cmd/idemgate

go 1.26.0

require (
	github.com/idemgate/idemgate v0.1.0
	github.com/jackc/pgx/v5 v5.12.0
	github.com/redis/go-redis/v9 v9.23.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.43.0 // indirect
)
