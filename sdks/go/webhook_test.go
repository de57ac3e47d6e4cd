package herald

import (
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// vectorsDir is sdks/vectors: HERALD_SDK_VECTORS, or beside this package.
func vectorsDir() string {
	if dir := os.Getenv("HERALD_SDK_VECTORS"); dir != "" {
		return dir
	}
	return filepath.Join("..", "vectors")
}

type signatureVectors struct {
	ToleranceSeconds int64 `json:"tolerance_seconds"`
	Sign             []struct {
		Name      string `json:"name"`
		Key       string `json:"key"`
		ID        string `json:"id"`
		Timestamp int64  `json:"timestamp"`
		Body      string `json:"body"`
		Signature string `json:"signature"`
	} `json:"sign"`
	Verify []struct {
		Name      string `json:"name"`
		Key       string `json:"key"`
		ID        string `json:"id"`
		Timestamp string `json:"timestamp"`
		Body      string `json:"body"`
		Signature string `json:"signature"`
		Now       int64  `json:"now"`
		Valid     bool   `json:"valid"`
	} `json:"verify"`
}

func loadSignatureVectors(t *testing.T) signatureVectors {
	raw, err := os.ReadFile(filepath.Join(vectorsDir(), "signatures.json"))
	if err != nil {
		t.Fatal(err)
	}
	var v signatureVectors
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Sign) == 0 || len(v.Verify) == 0 {
		t.Fatal("no vectors")
	}
	return v
}

func TestEverySignVectorGivesItsSignature(t *testing.T) {
	for _, v := range loadSignatureVectors(t).Sign {
		got, err := Sign(v.Key, v.ID, v.Timestamp, []byte(v.Body))
		if err != nil || got != v.Signature {
			t.Errorf("%s: got %q (%v), want %q", v.Name, got, err, v.Signature)
		}
	}
}

func TestEveryVerifyVectorVerifiesOrFailsAsItSays(t *testing.T) {
	vectors := loadSignatureVectors(t)
	for _, v := range vectors.Verify {
		headers := http.Header{}
		headers.Set("webhook-id", v.ID)
		headers.Set("webhook-timestamp", v.Timestamp)
		headers.Set("webhook-signature", v.Signature)
		wh, err := NewWebhook(v.Key)
		if err != nil {
			t.Fatalf("%s: %v", v.Name, err)
		}
		err = wh.VerifyAt([]byte(v.Body), headers, time.Unix(v.Now, 0), vectors.ToleranceSeconds)
		var failed *WebhookVerificationError
		if v.Valid && err != nil {
			t.Errorf("%s: should verify: %v", v.Name, err)
		}
		if !v.Valid && !errors.As(err, &failed) {
			t.Errorf("%s: should fail with a WebhookVerificationError, got %v", v.Name, err)
		}
	}
}

func TestAMissingHeaderAndABadKeyAreVerificationErrors(t *testing.T) {
	v := loadSignatureVectors(t).Verify[0]
	wh, err := NewWebhook(v.Key)
	if err != nil {
		t.Fatal(err)
	}
	headers := http.Header{"Webhook-Id": {v.ID}, "Webhook-Timestamp": {v.Timestamp}}
	if err := wh.VerifyAt([]byte(v.Body), headers, time.Unix(v.Now, 0), ToleranceSeconds); err == nil || err.Error() != "webhook verification failed: the webhook-signature header is missing" {
		t.Errorf("missing header: %v", err)
	}
	for _, key := range []string{"sk_live_nope", "whpk_AAAA", "whsec_!!"} {
		if _, err := NewWebhook(key); err == nil {
			t.Errorf("%s: accepted", key)
		}
	}
}
