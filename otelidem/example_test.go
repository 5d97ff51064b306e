package otelidem_test

import (
	"net/http"

	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"

	"github.com/idemgate/idemgate/middleware"
	"github.com/idemgate/idemgate/otelidem"
	"github.com/idemgate/idemgate/redisstore"
)

// A service's wiring. The providers are the application's: here the global
// ones, which record nothing until the application installs an SDK (the
// example service wires Prometheus, OTLP and stdout). The Example that reads
// the instruments back through the SDK is in otelidem/internal/sdktest, a
// module of its own, so that this module requires the OpenTelemetry API only.
func Example() {
	rec, err := otelidem.New(otelidem.Config{MeterProvider: otel.GetMeterProvider(), TracerProvider: otel.GetTracerProvider()})
	if err != nil {
		panic(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})

	e := echo.New()
	e.Use(rec.Server()) // a span per request
	e.POST("/v1/orders", func(c echo.Context) error {
		return c.JSON(http.StatusCreated, map[string]string{"order_id": "o_1"})
	}, middleware.New(middleware.Config{
		Store: rec.Store(redisstore.New(rdb)), // spans and durations of store calls
		Scope: func(c echo.Context) (tenant, user string, err error) {
			return c.Request().Header.Get("X-Tenant"), c.Request().Header.Get("X-User"), nil // stand-in for your auth
		},
		OnEvent: rec.OnEvent, // idemgate.requests by outcome
	}))
	_ = e.Start(":8080")
}
