// Package client is a Go client for APIs protected by idemgate.
package client
