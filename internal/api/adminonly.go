package api

import "net/http"

// AdminOnly serves h to callers with an admin API key only, as the API's
// own admin routes: for routes the server wires beside the API (the
// cluster's join tokens and node removal, package server).
func (s *Handler) AdminOnly(h http.Handler) http.Handler { return s.admin(h.ServeHTTP) }
