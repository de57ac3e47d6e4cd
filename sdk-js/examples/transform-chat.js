// A transform: reshapes Herald's event envelope into a chat message
// ({"text": "<type>: <summary>"}), and drops `*.test` events.
// Configuration: `prefix` (optional) is put in front of every message.

const plugin = { name: 'transform-chat-js', version: '1.0.0' };

function transform(ctx, req) {
  if (ctx.eventType.endsWith('.test')) {
    return { tag: 'drop', val: 'test events are not sent to chat' };
  }
  const event = JSON.parse(herald.text(req.body));
  const prefix = herald.config('prefix') ?? '';
  const summary = event.data?.summary ?? JSON.stringify(event.data);
  const body = JSON.stringify({ text: `${prefix}${event.type}: ${summary}` });
  return { tag: 'send', val: { headers: req.headers, body: herald.bytes(body) } };
}
