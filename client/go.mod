module github.com/idemgate/idemgate/client

go 1.26.0
