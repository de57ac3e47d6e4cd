// Command quickstart is the whole loop on one machine: a receiver that verifies what it gets,
// then a tenant, an endpoint to that receiver and an event, through the typed client. Run it
// against a node that allows private destinations (the receiver is on 127.0.0.1):
//
//	HERALD_URL=http://127.0.0.1:8080 HERALD_ADMIN_TOKEN=… go run ./examples/quickstart
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"time"

	herald "herald/sdks/go"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := herald.NewClient(env("HERALD_URL", "http://127.0.0.1:8080"), os.Getenv("HERALD_ADMIN_TOKEN"))
	tenant := env("HERALD_TENANT", "acme")

	// The receiver, as your service runs it: verify the raw body first, then handle it.
	var webhook *herald.Webhook
	verified := make(chan string, 1)
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go http.Serve(listener, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := webhook.Verify(body, r.Header); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		w.WriteHeader(http.StatusNoContent)
		verified <- fmt.Sprintf("verified %s: %s", r.Header.Get("webhook-id"), body)
	}))

	// A tenant (kept if it exists), an endpoint to the receiver, and an event.
	var apiErr *herald.APIError
	if _, err := client.CreateTenant(ctx, &herald.TenantIn{ID: tenant}); err != nil && !(errors.As(err, &apiErr) && apiErr.Code == herald.ErrorCodeConflict) {
		log.Fatal(err)
	}
	endpoint, err := client.CreateEndpoint(ctx, tenant, &herald.EndpointIn{
		URL:        herald.Ptr("http://" + listener.Addr().String() + "/hook"),
		EventTypes: []string{"invoice.*"},
	})
	if err != nil {
		log.Fatal(err)
	}
	if webhook, err = herald.NewWebhook(*endpoint.Secret); err != nil {
		log.Fatal(err)
	}
	accepted, err := client.CreateEvent(ctx, tenant, &herald.EventIn{Type: "invoice.paid", Payload: map[string]any{"amount": 1999, "currency": "EUR"}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("accepted", accepted.ID)
	select {
	case line := <-verified:
		fmt.Println(line)
	case <-ctx.Done():
		log.Fatal("nothing arrived within 30 s")
	}
}

func env(name, fallback string) string {
	if value := os.Getenv(name); value != "" {
		return value
	}
	return fallback
}
