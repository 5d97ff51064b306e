package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/idemgate/idemgate"
)

// problemTypeBase prefixes a code to make the RFC 9457 "type" URI; the same
// base the middleware uses, so clients see one vocabulary.
const problemTypeBase = "https://github.com/idemgate/idemgate#"

// problem is an application/problem+json (RFC 9457) error answer with the
// extension member "code".
type problem struct {
	Status int    `json:"status"`
	Code   string `json:"code"`
	Detail string `json:"detail,omitempty"`
}

func (p *problem) Error() string { return fmt.Sprintf("%d %s: %s", p.Status, p.Code, p.Detail) }

func (p *problem) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail,omitempty"`
		Code   string `json:"code"`
	}{problemTypeBase + p.Code, http.StatusText(p.Status), p.Status, p.Detail, p.Code})
}

func invalid(format string, args ...any) error {
	return &problem{Status: http.StatusBadRequest, Code: "invalid_request", Detail: fmt.Sprintf(format, args...)}
}

// errorHandler answers every error as a problem document: the handlers'
// *problem, echo's HTTP errors (404, 405, ...) and, for anything else, a
// 500 whose detail is logged but not sent.
func errorHandler(logger *slog.Logger) echo.HTTPErrorHandler {
	return func(err error, c echo.Context) {
		if c.Response().Committed {
			return
		}
		var p *problem
		var he *echo.HTTPError
		switch {
		case errors.As(err, &p):
		case errors.Is(err, idemgate.ErrKeyReused):
			// The middleware answers this itself; kept as a backstop.
			p = &problem{Status: http.StatusConflict, Code: string(idemgate.CodeKeyReused),
				Detail: "this Idempotency-Key was used with other parameters"}
		case errors.As(err, &he):
			p = &problem{Status: he.Code, Code: codeForStatus(he.Code)}
			if msg, ok := he.Message.(string); ok {
				p.Detail = msg
			}
		default:
			logger.Error("request failed", "method", c.Request().Method, "path", c.Path(), "err", err)
			p = &problem{Status: http.StatusInternalServerError, Code: "internal"}
		}
		b, _ := json.Marshal(p)
		c.Response().Header().Set("Cache-Control", "no-store")
		if c.Request().Method == http.MethodHead {
			_ = c.NoContent(p.Status)
			return
		}
		_ = c.Blob(p.Status, "application/problem+json", b)
	}
}

func codeForStatus(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return "unauthorized"
	case http.StatusNotFound:
		return "not_found"
	case http.StatusMethodNotAllowed:
		return "method_not_allowed"
	case http.StatusRequestEntityTooLarge:
		return string(idemgate.CodeBodyTooLarge)
	case http.StatusUnsupportedMediaType:
		return "unsupported_media_type"
	}
	if status >= 500 {
		return "internal"
	}
	return "bad_request"
}
