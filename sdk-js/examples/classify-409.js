// A classifier: many receivers answer 409 Conflict when they have already processed an
// event (idempotency keys), which Herald's built-in table treats as a permanent failure.
// Configuration: `on_409` = "delivered" (default) or "retry"; `retry_after` = seconds to
// wait when retrying (default 60). Every other outcome gets `default` (the built-in table).

const plugin = { name: 'classify-409-js', version: '1.0.0', classifyStatuses: [409] };

function classify(ctx, outcome) {
  if (outcome.tag !== 'response' || outcome.val.status !== 409) return { tag: 'default' };
  const mode = herald.config('on_409') ?? 'delivered';
  if (mode === 'delivered') return { tag: 'delivered' };
  if (mode === 'retry') {
    const after = Number.parseInt(herald.config('retry_after') ?? '60', 10);
    return { tag: 'retry', val: Number.isFinite(after) ? after : 60 };
  }
  herald.log('warn', `unknown on_409 value ${JSON.stringify(mode)} for ${ctx.endpointId}; using the built-in table`);
  return { tag: 'default' };
}
