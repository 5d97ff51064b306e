module github.com/idemgate/idemgate/cmd/idemgate

go 1.26.0
