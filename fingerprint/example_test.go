package fingerprint_test

import (
	"fmt"
	"net/http/httptest"
	"strings"

	"github.com/idemgate/idemgate/fingerprint"
)

func ExampleCanonicalize() {
	out, err := fingerprint.Canonicalize([]byte(`{"b": [1.0, 1e21, 0.0000001], "a": "\u00e9\/"}`))
	if err != nil {
		panic(err)
	}
	fmt.Println(string(out))

	_, err = fingerprint.Canonicalize([]byte(`{"a": 1, "a": 2}`))
	fmt.Println(err)
	// Output:
	// {"a":"é/","b":[1,1e+21,1e-7]}
	// fingerprint: invalid JSON: duplicate member name at offset 9
}

// A retry whose parameters are the same has the same fingerprint, whatever
// the member order and whitespace; a changed prompt does not.
func ExampleSpec_Sum() {
	spec := fingerprint.Spec{
		Fields: []string{"/prompt", "/aspect_ratio", "/n", "/reference_image"},
	}
	first, _ := spec.Sum([]byte(`{"prompt":"a lighthouse","aspect_ratio":"16:9","n":1,"client_note":"first try"}`))
	retry, _ := spec.Sum([]byte(`{ "n": 1.0, "aspect_ratio": "16:9", "prompt": "a lighthouse", "client_note": "retry" }`))
	reworded, _ := spec.Sum([]byte(`{"prompt":"a lighthouse at dusk","aspect_ratio":"16:9","n":1}`))
	withNull, _ := spec.Sum([]byte(`{"prompt":"a lighthouse","aspect_ratio":"16:9","n":1,"reference_image":null}`))

	fmt.Println("retry:", first == retry)
	fmt.Println("reworded prompt:", first == reworded)
	fmt.Println("null instead of absent:", first == withNull)
	fmt.Println(first)
	// Output:
	// retry: true
	// reworded prompt: false
	// null instead of absent: false
	// v1:ee7192b6c9908d541b1ce3e5c38a35c76da5b0c7903b70f42af45163d4b33feb
}

// Sum compares numbers exactly: spellings of one decimal agree, two
// integers that are the same double do not.
func ExampleSpec_Sum_numbers() {
	var spec fingerprint.Spec
	sum := func(body string) fingerprint.Fingerprint {
		fp, err := spec.Sum([]byte(body))
		if err != nil {
			panic(err)
		}
		return fp
	}
	fmt.Println(sum(`{"n":1}`) == sum(`{"n":1.0}`), sum(`{"n":1}`) == sum(`{"n":10e-1}`))
	fmt.Println(sum(`{"id":9007199254740993}`) == sum(`{"id":9007199254740992}`))

	// Canonicalize, being RFC 8785, reads numbers as doubles.
	a, _ := fingerprint.Canonicalize([]byte(`9007199254740993`))
	fmt.Println(string(a))
	// Output:
	// true true
	// false
	// 9007199254740992
}

func ExampleSpec_SumRequest() {
	spec := fingerprint.Spec{Exclude: []string{"/trace"}}
	sum := func(contentType, body string) fingerprint.Fingerprint {
		r := httptest.NewRequest("POST", "/v1/images", strings.NewReader(body))
		r.Header.Set("Content-Type", contentType)
		fp, err := spec.SumRequest(r, []byte(body))
		if err != nil {
			panic(err)
		}
		return fp
	}
	form := "application/x-www-form-urlencoded"
	fmt.Println(sum(form, "prompt=a+cat&n=2&trace=1") == sum(form, "n=2&prompt=a%20cat&trace=2"))
	fmt.Println(sum("application/json", `{"n":2}`) == sum("text/plain", `{"n":2}`))
	// Output:
	// true
	// false
}

func ExampleSpec_Validate() {
	spec := fingerprint.Spec{Fields: []string{"prompt"}}
	fmt.Println(spec.Validate())
	// Output:
	// fingerprint: field "prompt": invalid JSON Pointer: must be empty or start with '/'
}

// A Route binds a body fingerprint to the request target: the same body
// sent to another order, or with another query, is another request.
func ExampleRoute() {
	refund := fingerprint.NewRoute("POST", "/v1/orders/:id/refund") // once per route
	body, err := fingerprint.Spec{}.Sum([]byte(`{"amount":"12.00"}`))
	if err != nil {
		panic(err)
	}
	one := refund.Sum([]string{"id"}, []string{"1"}, "", body)
	two := refund.Sum([]string{"id"}, []string{"2"}, "", body)
	dry := refund.Sum([]string{"id"}, []string{"1"}, "dry_run=true", body)
	fmt.Println(one == refund.Sum([]string{"id"}, []string{"1"}, "", body))
	fmt.Println(one == two, one == dry)
	// Output:
	// true
	// false false
}

// A route compiles its Spec once and fingerprints every request with it;
// the result is the Spec's own.
func ExampleSpec_Compile() {
	spec := fingerprint.Spec{Fields: []string{"/prompt", "/n"}}
	compiled, err := spec.Compile()
	if err != nil {
		panic(err)
	}
	r := httptest.NewRequest("POST", "/v1/images", nil)
	r.Header.Set("Content-Type", "application/json")
	body := []byte(`{"prompt":"a lighthouse","n":1,"client_note":"retry"}`)
	fp, _ := compiled.SumRequest(r, body)
	same, _ := spec.SumRequest(r, body)
	fmt.Println(fp == same)

	_, err = fingerprint.Spec{Fields: []string{"prompt"}}.Compile()
	fmt.Println(err)
	// Output:
	// true
	// fingerprint: field "prompt": invalid JSON Pointer: must be empty or start with '/'
}
