package herald

// Against a live node (HERALD_URL, HERALD_ADMIN_TOKEN; skipped without them): a tenant and an
// endpoint whose receiver this test runs on 127.0.0.1, an event, its delivery read back, and
// the request the receiver got verified with the SDK; then the API error vectors of
// sdks/vectors/errors.json through the typed client.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

type received struct {
	headers http.Header
	body    []byte
}

func liveNode(t *testing.T) (string, string) {
	url, token := os.Getenv("HERALD_URL"), os.Getenv("HERALD_ADMIN_TOKEN")
	if url == "" || token == "" {
		t.Skip("set HERALD_URL and HERALD_ADMIN_TOKEN to test against a node")
	}
	return url, token
}

// newTenant creates a tenant of this run's own: a node's tenants outlive a test.
func newTenant(t *testing.T, ctx context.Context, admin *Client, kind string) string {
	id := fmt.Sprintf("sdk-go-%s-%d-%d", kind, os.Getpid(), time.Now().UnixNano())
	name := "Go SDK test"
	tenant, err := admin.CreateTenant(ctx, &TenantIn{ID: id, Name: &name})
	if err != nil || tenant.ID != id {
		t.Fatalf("create tenant: %v %v", tenant, err)
	}
	return id
}

// eventually polls probe every 50 ms until it answers true, for at most 10 s.
func eventually(t *testing.T, what string, probe func() bool) {
	deadline := time.Now().Add(10 * time.Second)
	for !probe() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestLiveAnEventGoesOutSignedAndTheSDKVerifiesWhatArrived(t *testing.T) {
	url, token := liveNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := NewClient(url, token)
	tenant := newTenant(t, ctx, admin, "flow")
	arrived := make(chan received, 8)
	rx := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		arrived <- received{r.Header, body}
	}))
	defer rx.Close()

	endpoint, err := admin.CreateEndpoint(ctx, tenant, &EndpointIn{URL: Ptr(rx.URL + "/hook"), Signatures: []Scheme{SchemeV1, SchemeV1a}})
	if err != nil {
		t.Fatal(err)
	}
	if endpoint.Secret == nil || len(endpoint.PublicKeys) == 0 {
		t.Fatalf("a v1 and v1a endpoint shows its secret and public key: %+v", endpoint)
	}
	event := EventIn{ID: Ptr("evt_sdk_go"), Type: "invoice.paid", Payload: map[string]any{"amount": 1999, "currency": "EUR"}}
	accepted, err := admin.CreateEvent(ctx, tenant, &event)
	if err != nil || accepted.ID != "evt_sdk_go" {
		t.Fatalf("create event: %+v %v", accepted, err)
	}

	var got received
	select {
	case got = <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the receiver got no request within 10 s")
	}
	for _, key := range []string{*endpoint.Secret, endpoint.PublicKeys[0].PublicKey} {
		wh, err := NewWebhook(key)
		if err != nil {
			t.Fatal(err)
		}
		if err := wh.Verify(got.body, got.headers); err != nil {
			t.Errorf("%s: %v", key[:5], err)
		}
		var failed *WebhookVerificationError
		if err := wh.Verify(append(got.body, ' '), got.headers); !errors.As(err, &failed) {
			t.Errorf("%s: a changed body verifies: %v", key[:5], err)
		}
	}
	var envelope struct {
		Type string         `json:"type"`
		Data map[string]any `json:"data"`
	}
	if err := json.Unmarshal(got.body, &envelope); err != nil || envelope.Type != "invoice.paid" || envelope.Data["currency"] != "EUR" {
		t.Errorf("the envelope: %s (%v)", got.body, err)
	}
	if got.headers.Get("webhook-id") != "evt_sdk_go" {
		t.Errorf("webhook-id: %q", got.headers.Get("webhook-id"))
	}

	var delivery *DeliveryOut
	eventually(t, "the delivery is delivered", func() bool {
		page, err := admin.ListEventDeliveries(ctx, tenant, "evt_sdk_go", nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := range page.Data {
			if page.Data[i].State == DeliveryStateDelivered {
				delivery = &page.Data[i]
			}
		}
		return delivery != nil
	})
	if delivery.EndpointID != endpoint.ID {
		t.Errorf("endpoint %s, want %s", delivery.EndpointID, endpoint.ID)
	}
	detail, err := admin.GetDelivery(ctx, tenant, delivery.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(detail.AttemptHistory) != 1 || detail.AttemptHistory[0].Status == nil || *detail.AttemptHistory[0].Status != 200 {
		t.Errorf("attempts: %+v", detail.AttemptHistory)
	}
}

type errorVector struct {
	Name              string            `json:"name"`
	Operation         string            `json:"operation"`
	Params            map[string]string `json:"params"`
	Query             json.RawMessage   `json:"query"`
	Body              json.RawMessage   `json:"body"`
	Token             string            `json:"token"`
	Status            int               `json:"status"`
	Code              string            `json:"code"`
	MessageStartsWith string            `json:"message_starts_with"`
}

func TestLiveEveryAPIErrorVectorFailsWithItsStatusAndCode(t *testing.T) {
	url, token := liveNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	raw, err := os.ReadFile(filepath.Join(vectorsDir(), "errors.json"))
	if err != nil {
		t.Fatal(err)
	}
	var vectors struct {
		Errors []errorVector `json:"errors"`
	}
	if err := json.Unmarshal(raw, &vectors); err != nil || len(vectors.Errors) == 0 {
		t.Fatalf("errors.json: %v", err)
	}
	admin := NewClient(url, token)
	tenant := newTenant(t, ctx, admin, "errors")
	read, err := admin.CreateToken(ctx, tenant, &TokenIn{Scopes: []string{"read"}})
	if err != nil {
		t.Fatal(err)
	}
	clients := map[string]*Client{"admin": admin, "read": NewClient(url, read.Token),
		"bogus": NewClient(url, "hrld_not_a_token_herald_issued"), "none": NewClient(url, "")}
	for _, v := range vectors.Errors {
		err := callByVector(ctx, clients[v.Token], v, tenant)
		var apiErr *APIError
		if !errors.As(err, &apiErr) {
			t.Errorf("%s: want an *APIError, got %v", v.Name, err)
			continue
		}
		if apiErr.Status != v.Status || string(apiErr.Code) != v.Code || !strings.HasPrefix(apiErr.Message, v.MessageStartsWith) {
			t.Errorf("%s: got %d %s %q, want %d %s %q…", v.Name, apiErr.Status, apiErr.Code, apiErr.Message, v.Status, v.Code, v.MessageStartsWith)
		}
	}
}

// callByVector calls the typed method named after the vector's operation, its arguments
// decoded into the method's own parameter types.
func callByVector(ctx context.Context, client *Client, v errorVector, tenant string) error {
	var op *Operation
	for i := range Operations {
		if strings.EqualFold(strings.ReplaceAll(v.Operation, "_", ""), Operations[i].Name) {
			op = &Operations[i]
		}
	}
	if op == nil {
		return fmt.Errorf("no operation %s", v.Operation)
	}
	method := reflect.ValueOf(client).MethodByName(op.Name)
	args := []reflect.Value{reflect.ValueOf(ctx)}
	for _, p := range op.PathParams {
		args = append(args, reflect.ValueOf(strings.ReplaceAll(v.Params[p], "$tenant", tenant)))
	}
	for len(args) < method.Type().NumIn() {
		kind := method.Type().In(len(args))
		arg := reflect.New(kind).Elem()
		text := v.Body
		if strings.HasSuffix(kind.String(), "Query") {
			text = v.Query
		}
		if len(text) > 0 {
			text = json.RawMessage(strings.ReplaceAll(string(text), "$tenant", tenant))
			if err := json.Unmarshal(text, arg.Addr().Interface()); err != nil {
				return fmt.Errorf("%s: %v", v.Name, err)
			}
		}
		args = append(args, arg)
	}
	out := method.Call(args)
	if err, _ := out[len(out)-1].Interface().(error); err != nil {
		return err
	}
	return errors.New("no error")
}
