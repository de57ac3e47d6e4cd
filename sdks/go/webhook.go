// Hand-written: verifies (and signs) Standard Webhooks signatures as Herald sends them.
// v1: HMAC-SHA256 with the endpoint's whsec_ secret; v1a: ed25519 (crypto/ed25519), checked
// with the endpoint's whpk_ public key. Both sign "{webhook-id}.{webhook-timestamp}.{body}".

package herald

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// ToleranceSeconds is how far webhook-timestamp may be from now before a request is refused.
const ToleranceSeconds = 300

func verificationError(why string) error {
	return &WebhookVerificationError{Reason: why}
}

// WebhookVerificationError is a request that does not carry a valid signature of the key,
// or is too old or too new.
type WebhookVerificationError struct {
	Reason string
}

func (e *WebhookVerificationError) Error() string { return "webhook verification failed: " + e.Reason }

// Webhook verifies requests with one key: a whsec_ secret (v1) or a whpk_ public key (v1a).
type Webhook struct {
	version string
	check   func(message, sig []byte) bool
}

// NewWebhook parses key: "whsec_…" (v1) or "whpk_…" (v1a).
func NewWebhook(key string) (*Webhook, error) {
	switch {
	case strings.HasPrefix(key, "whsec_"):
		secret, err := keyBytes(key, "whsec_")
		if err != nil {
			return nil, err
		}
		return &Webhook{version: "v1", check: func(message, sig []byte) bool {
			mac := hmac.New(sha256.New, secret)
			mac.Write(message)
			return hmac.Equal(mac.Sum(nil), sig)
		}}, nil
	case strings.HasPrefix(key, "whpk_"):
		raw, err := keyBytes(key, "whpk_")
		if err != nil {
			return nil, err
		}
		if len(raw) != ed25519.PublicKeySize {
			return nil, verificationError("a whpk_ key is 32 bytes")
		}
		public := ed25519.PublicKey(raw)
		return &Webhook{version: "v1a", check: func(message, sig []byte) bool {
			return len(sig) == ed25519.SignatureSize && ed25519.Verify(public, message, sig)
		}}, nil
	}
	return nil, verificationError(`the key must start with "whsec_" (v1) or "whpk_" (v1a)`)
}

// Verify checks the request's headers and body now.
func (w *Webhook) Verify(body []byte, headers http.Header) error {
	return w.VerifyAt(body, headers, time.Now(), ToleranceSeconds)
}

// VerifyAt checks the request's headers and body against the time now, with a tolerance in seconds.
func (w *Webhook) VerifyAt(body []byte, headers http.Header, now time.Time, toleranceSeconds int64) error {
	var values [3]string
	for i, name := range [3]string{"webhook-id", "webhook-timestamp", "webhook-signature"} {
		found := headers.Values(name)
		if len(found) == 0 {
			return verificationError("the " + name + " header is missing")
		}
		values[i] = found[0]
	}
	id, timestamp, signature := values[0], values[1], values[2]
	if !integer.MatchString(timestamp) {
		return verificationError("webhook-timestamp is not an integer")
	}
	ts, err := strconv.ParseInt(timestamp, 10, 64)
	if err != nil {
		return verificationError("webhook-timestamp is not an integer")
	}
	if diff := now.Unix() - ts; diff > toleranceSeconds || -diff > toleranceSeconds {
		return verificationError("webhook-timestamp is too far from now")
	}
	message := signedContent(id, timestamp, body)
	prefix := w.version + ","
	for _, entry := range strings.Split(signature, " ") {
		if !strings.HasPrefix(entry, prefix) {
			continue
		}
		if sig, ok := decode(entry[len(prefix):]); ok && w.check(message, sig) {
			return nil
		}
	}
	return verificationError("no signature of this key matches")
}

// Sign gives the webhook-signature entry of key: a whsec_ secret (v1) or a whsk_ signing key (v1a).
func Sign(key, id string, timestamp int64, body []byte) (string, error) {
	message := signedContent(id, strconv.FormatInt(timestamp, 10), body)
	switch {
	case strings.HasPrefix(key, "whsec_"):
		secret, err := keyBytes(key, "whsec_")
		if err != nil {
			return "", err
		}
		mac := hmac.New(sha256.New, secret)
		mac.Write(message)
		return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil)), nil
	case strings.HasPrefix(key, "whsk_"):
		raw, err := keyBytes(key, "whsk_")
		if err != nil {
			return "", err
		}
		if len(raw) != ed25519.SeedSize && len(raw) != ed25519.PrivateKeySize {
			return "", verificationError("a whsk_ key is 32 bytes (the seed) or 64 (seed, then public key)")
		}
		private := ed25519.NewKeyFromSeed(raw[:ed25519.SeedSize])
		return "v1a," + base64.StdEncoding.EncodeToString(ed25519.Sign(private, message)), nil
	}
	return "", verificationError(`the key must start with "whsec_" (v1) or "whsk_" (v1a)`)
}

var (
	base64Text = regexp.MustCompile(`^[A-Za-z0-9+/]+={0,2}$`)
	integer    = regexp.MustCompile(`^-?[0-9]+$`)
)

func signedContent(id, timestamp string, body []byte) []byte {
	message := make([]byte, 0, len(id)+len(timestamp)+len(body)+2)
	message = append(message, id...)
	message = append(message, '.')
	message = append(message, timestamp...)
	message = append(message, '.')
	return append(message, body...)
}

// decode reads standard base64, padding optional.
func decode(text string) ([]byte, bool) {
	if !base64Text.MatchString(text) {
		return nil, false
	}
	raw, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(text, "="))
	return raw, err == nil
}

func keyBytes(key, prefix string) ([]byte, error) {
	raw, ok := decode(key[len(prefix):])
	if !ok {
		return nil, verificationError("the " + prefix + " key is not base64")
	}
	return raw, nil
}
