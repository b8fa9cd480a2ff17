// One text turn through the OpenAI Agents SDK's RealtimeSession over its Node WebSocket
// transport, against ws://HOST:PORT/v1/realtime (tests/e2e/test_realtime_agents_js.py).
// usage: node realtime_turn.mjs URL QUESTION INSTRUCTIONS
// Prints one JSON line per server event the transport saw ({"event": {...}}, audio
// deltas without their audio), then {"summary": {...}}: the response's status, the
// audio's size, the assistant's transcript in the session history, and the server's
// error events (code and param). Exits 1 when no response.done comes within 120 s.
import { RealtimeAgent, RealtimeSession } from '@openai/agents/realtime';

const [url, question, instructions] = process.argv.slice(2);
const agent = new RealtimeAgent({ name: 'Assistant', instructions });
// the SDK's default session config: what an application gets without configuring one
const session = new RealtimeSession(agent, { transport: 'websocket', model: 'quicksilver' });

let audioBytes = 0;
const errors = [];
session.on('audio', (event) => {
  audioBytes += event.data.byteLength;
});
session.on('error', () => {}); // the server's error events are kept below
const done = new Promise((resolve) => {
  session.on('transport_event', (event) => {
    const shown = 'delta' in event && event.type === 'response.output_audio.delta'
      ? { ...event, delta: `${event.delta.length} base64 chars` }
      : event;
    console.log(JSON.stringify({ event: shown }));
    if (event.type === 'error') {
      errors.push({ code: event.error.code, param: event.error.param });
    }
    if (event.type === 'response.done') resolve(event.response);
  });
});
const timeout = new Promise((resolve) => setTimeout(() => resolve(null), 120_000).unref());

await session.connect({ apiKey: 'not-needed-on-loopback', url });
session.sendMessage(question);
const response = await Promise.race([done, timeout]);
const assistant = session.history.filter((item) => item.role === 'assistant');
const transcript = assistant.flatMap((item) => item.content)
  .map((part) => part.transcript ?? part.text ?? '').join('');
console.log(JSON.stringify({
  summary: {
    status: response?.status ?? null,
    audio_bytes: audioBytes,
    transcript,
    errors,
  },
}));
session.close();
process.exit(response === null ? 1 : 0);
