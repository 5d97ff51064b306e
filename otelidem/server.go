package otelidem

import (
	"net/http"

	"github.com/labstack/echo/v4"
	echomw "github.com/labstack/echo/v4/middleware"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Server returns echo middleware that starts a server span per request,
// continuing the caller's trace from the request headers. Store calls,
// Submit and the task's attempts become its descendants. Add it with
// e.Use so that it wraps every route.
func (r *Recorder) Server() echo.MiddlewareFunc {
	return r.ServerWithSkipper(echomw.DefaultSkipper)
}

// ServerWithSkipper is Server with a skipper, e.g. for health checks.
func (r *Recorder) ServerWithSkipper(skip echomw.Skipper) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if skip(c) {
				return next(c)
			}
			req := c.Request()
			ctx := r.cfg.Propagator.Extract(req.Context(), propagation.HeaderCarrier(req.Header))
			route := c.Path()
			method := knownMethod(req.Method)
			name := method
			if route != "" {
				name += " " + route
			}
			ctx, span := r.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer),
				trace.WithAttributes(keyMethod.String(method), keyRoute.String(route)))
			defer span.End()
			c.SetRequest(req.WithContext(ctx))
			err := next(c)
			if err != nil {
				// Let echo's error handler write the answer now, as echo's
				// Logger does, so the span carries the status the client gets.
				c.Error(err)
			}
			status := c.Response().Status
			span.SetAttributes(keyStatus.Int(status))
			if status >= 500 {
				span.SetStatus(codes.Error, "")
			}
			return err
		}
	}
}

// knownMethod returns m when it is a method of RFC 9110 or RFC 5789, and
// _OTHER otherwise (as OTel's HTTP conventions ask): a client chooses the
// method, and a span name per made-up method would carry what it sent.
func knownMethod(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return m
	}
	return "_OTHER"
}
