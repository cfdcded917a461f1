package dashboard

import (
	"crypto/subtle"
	"net/http"
	"net/url"
	"strings"
)

// cookieName holds the token a person gave the login form.
const cookieName = "loopbus_token"

// guard checks every request before the routes see it:
//
//   - without a token (loopback only), the Host header must name this
//     machine: a page of another site whose name was pointed at 127.0.0.1
//     (DNS rebinding) is refused;
//   - a request that changes something (any method but GET and HEAD) must
//     come from the dashboard's own pages: a browser's Origin or
//     Sec-Fetch-Site must say so (programs that send neither pass, as
//     no browser does that for a cross-site request);
//   - with a token, every request but the login form and its style must
//     carry it: as a bearer token, or in the login form's cookie.
func (s *Service) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "same-origin")
		if s.cfg.Token == "" && !loopbackHost(trimPort(r.Host)) {
			http.Error(w, "refused: host "+r.Host+" is not this machine (the dashboard listens on loopback without a token)", http.StatusForbidden)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead && !sameOrigin(r) {
			http.Error(w, "refused: a change must come from the dashboard's own pages (cross-origin request)", http.StatusForbidden)
			return
		}
		if s.cfg.Token != "" && !s.authorized(r) && !public(r) {
			if strings.HasPrefix(r.URL.Path, "/api/") || r.Method != http.MethodGet || r.Header.Get("Authorization") != "" || !acceptsHTML(r) {
				h.Set("WWW-Authenticate", `Bearer realm="loopbus"`)
				http.Error(w, "unauthorized: this dashboard needs its token (Authorization: Bearer TOKEN, or log in at /login)", http.StatusUnauthorized)
				return
			}
			http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// public are the requests a person without the token may make: the login
// form and the static files pages are drawn with (they hold no data).
func public(r *http.Request) bool {
	return r.URL.Path == "/login" || strings.HasPrefix(r.URL.Path, "/static/")
}

func acceptsHTML(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), "text/html")
}

// authorized reports whether r carries the token.
func (s *Service) authorized(r *http.Request) bool {
	if t, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return equal(strings.TrimSpace(t), s.cfg.Token)
	}
	if c, err := r.Cookie(cookieName); err == nil {
		return equal(c.Value, s.cfg.Token)
	}
	return false
}

func equal(a, b string) bool {
	return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// sameOrigin reports whether r comes from this dashboard's pages, by what
// browsers send: Sec-Fetch-Site, else Origin.
func sameOrigin(r *http.Request) bool {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" {
		return site == "same-origin" || site == "none"
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true // not a browser
	}
	u, err := url.Parse(origin)
	return err == nil && u.Host == r.Host
}

// loginError is the message the login form shows for code: the page never
// shows text from its address.
func loginError(code string) string {
	if code == "wrong" {
		return "That is not the token."
	}
	return ""
}

// localPath returns next if it is a path of this site, else "/": a login
// must not send the browser elsewhere. Browsers drop tabs and newlines
// from addresses, so "/\t/evil.example" would be "//evil.example".
func localPath(next string) string {
	if strings.ContainsFunc(next, func(r rune) bool { return r < 0x20 || r == 0x7f || r == '\\' }) {
		return "/"
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || !strings.HasPrefix(u.Path, "/") || strings.HasPrefix(next, "//") {
		return "/"
	}
	return u.RequestURI()
}

// login checks the token from the login form and keeps it in a cookie.
func (s *Service) login(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, "bad form", http.StatusBadRequest)
		return
	}
	next := localPath(r.PostForm.Get("next"))
	if s.cfg.Token == "" {
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	}
	if !equal(r.PostForm.Get("token"), s.cfg.Token) {
		http.Redirect(w, r, "/login?error=wrong&next="+url.QueryEscape(next), http.StatusSeeOther)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: s.cfg.Token, Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	http.Redirect(w, r, next, http.StatusSeeOther)
}
