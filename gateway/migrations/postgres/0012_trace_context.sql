-- W3C trace context an event came with (its producer's `traceparent` and `tracestate`, or
-- the trace Herald started for it when exporting spans); NULL: none. Every attempt sends
-- it on with a span id of its own.
ALTER TABLE events ADD COLUMN traceparent TEXT;
ALTER TABLE events ADD COLUMN tracestate TEXT;
