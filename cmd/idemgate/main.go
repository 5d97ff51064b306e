// Command idemgate is the operator CLI for services that use idemgate.
package main

func main() {}
