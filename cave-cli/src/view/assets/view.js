// The session viewer: renders the server's events (docs/FORMATS.md) as they arrive.
// Everything from the session is set as text (textContent), never parsed as HTML, but for the
// HTML the server itself wrote from the model's Markdown (`prose_html`, `html`: raw HTML in it
// escaped, links to the web only); what a cell showed as HTML is loaded in a sandboxed frame
// that runs no script, and sized to its content.
'use strict';

const main = document.getElementById('session');
const connection = document.getElementById('connection');
const footer = document.getElementById('ledger');
// The tallest a frame grows to fit what a cell showed (it scrolls past that).
const MAX_FRAME_HEIGHT = 1600;
const MAX_NESTING = 64;
let received = 0;

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function seconds(value) {
  return typeof value === 'number' ? value.toFixed(value < 10 ? 2 : 1) + ' s' : '';
}

function tokens(usage) {
  if (!usage) return '';
  const parts = `${usage.total_tokens} tokens (${usage.prompt_tokens} in, ${usage.completion_tokens} out`;
  return parts + (usage.estimated ? ', estimated)' : ')');
}

// Where the events of the session itself, or of one sub-agent, go.
const contexts = new Map();

function newContext(box) {
  return { box, turn: null, step: null, stepNumber: 0, text: null, thinking: null, live: null, shown: [] };
}

function context(path) {
  let current = contexts.get('') || contexts.set('', newContext(main)).get('');
  let key = '';
  for (const agent of path) {
    key += '\u0000' + agent;
    const parent = current;
    const parentStep = stepOf(parent);
    let found = contexts.get(key);
    if (!found || found.parentStep !== parentStep) {
      const box = el('div', 'sub');
      box.append(el('div', 'agent', 'sub-agent ' + agent));
      parentStep.append(box);
      found = newContext(box);
      found.parentStep = parentStep;
      contexts.set(key, found);
    }
    current = found;
  }
  return current;
}

function stepOf(c) {
  if (!c.step) {
    c.stepNumber += 1;
    c.step = el('article', 'step');
    c.step.append(el('h3', null, 'Step ' + c.stepNumber));
    (c.turn || c.box).append(c.step);
  }
  return c.step;
}

function note(c, text, error) {
  stepOf(c).append(el('p', error ? 'note error' : 'note', text));
}

// A note about the session rather than a step of it.
function aside(c, text, error) {
  (c.turn || c.box).append(el('p', error ? 'note error' : 'note', text));
}

// Ends the prose streamed so far: the server wrote it as HTML on the event that ends it.
function settle(c, e) {
  if (c.text && e && typeof e.prose_html === 'string') {
    c.text.innerHTML = e.prose_html;
    c.text.classList.add('markdown');
  }
  c.text = null;
  c.thinking = null;
}

// A frame as tall as what it shows: its document is of this origin (`allow-same-origin`) but
// runs no script (no `allow-scripts`), so the page reads its height.
function fitFrame(frame) {
  try {
    const doc = frame.contentDocument;
    if (!doc || !doc.documentElement) return;
    const height = Math.max(doc.documentElement.scrollHeight, doc.body ? doc.body.scrollHeight : 0);
    frame.style.height = Math.min(height + 4, MAX_FRAME_HEIGHT) + 'px';
  } catch (_) {
    // Not readable: the frame keeps its height and scrolls.
  }
}

const IMAGE_TYPES = ['image/png', 'image/jpeg', 'image/gif', 'image/webp', 'image/svg+xml'];

function display(c, e) {
  const urls = e.urls || {};
  const figure = el('figure', 'display');
  const image = IMAGE_TYPES.find((mime) => urls[mime]);
  if (image) {
    const img = el('img');
    img.src = urls[image];
    img.alt = e.text || image;
    figure.append(img);
  } else if (urls['text/html']) {
    const frame = el('iframe');
    // Same origin, so that the page can size it; no `allow-scripts`: no script runs in it, no
    // forms, no navigation of the page (the server's policy for it says the same).
    frame.setAttribute('sandbox', 'allow-same-origin');
    frame.setAttribute('referrerpolicy', 'no-referrer');
    frame.title = 'HTML shown by a cell';
    frame.addEventListener('load', () => fitFrame(frame));
    frame.src = urls['text/html'];
    figure.append(frame);
  } else {
    figure.append(el('pre', 'output', e.text));
  }
  const files = Object.entries(e.files || {}).map(([mime, path]) => `${mime}: ${path}`);
  const types = (e.mime_types || []).join(', ');
  figure.append(el('figcaption', null, files.length ? files.join(' · ') : types));
  stepOf(c).append(figure);
  // Its text form is in the cell's output too: shown once, as the figure or table.
  if ((image || urls['text/html']) && e.text) c.shown.push(String(e.text));
}

// The cell's output without the text forms of what it showed richly (each once, where it was).
function withoutShown(c, output) {
  let text = String(output);
  for (const shown of c.shown) {
    const at = text.indexOf(shown);
    if (at < 0) continue;
    let end = at + shown.length;
    if (text[end] === '\n') end += 1;
    text = text.slice(0, at) + text.slice(end);
  }
  c.shown = [];
  return text;
}

function code(c, e) {
  settle(c, e);
  const pre = el('pre', 'code');
  if (Array.isArray(e.spans)) {
    for (const [name, text] of e.spans) {
      if (name) pre.append(el('span', 'hl-' + String(name).replace('.', '-'), text));
      else pre.append(document.createTextNode(String(text)));
    }
  } else {
    pre.textContent = e.code || '';
  }
  stepOf(c).append(pre);
  if (e.unclosed) note(c, 'the answer ended inside this block; it ran as it was');
  if (e.tool_call) note(c, `from a call of the tool ${e.tool_call}: its code ran as the block`);
}

function result(c, e) {
  const pre = c.live || el('pre');
  pre.className = e.success ? 'output' : 'output failed';
  const output = withoutShown(c, e.output || '');
  pre.textContent = output;
  if (!c.live) stepOf(c).append(pre);
  // Nothing left but what the figures and tables show.
  if (e.success && !output.trim()) pre.remove();
  c.live = null;
  if (e.persisted_variable) note(c, `the whole output is in the variable ${e.persisted_variable}`);
  if (e.state_lost) note(c, "the runtime's state was lost; it starts afresh", true);
}

function status(c, e) {
  switch (e.status) {
    case 'compacting': return note(c, 'summarizing the history…');
    case 'compacted': return note(c, `history summarized: ${e.before} messages to ${e.after}`);
    case 'compaction_failed': return note(c, 'summarizing failed: ' + e.message, true);
    case 'output_recovery': return note(c, `the answer was cut off; resuming (${e.recovery} of ${e.max_recoveries})`);
    case 'tool_calls_answered': return note(c, `the model called ${(e.tools || []).join(', ')}; there are no tools, it was told to write code`);
    case 'isolation': return aside(c, 'isolation: ' + (e.layers || []).join('; '));
    default: return undefined;
  }
}

function render(event) {
  const path = [];
  let e = event;
  while (e && e.type === 'sub_agent' && e.event && path.length < MAX_NESTING) {
    path.push(String(e.agent));
    e = e.event;
  }
  const c = context(path);
  switch (e.type) {
    case 'user_prompt': {
      settle(c, e);
      c.turn = el(path.length ? 'div' : 'section', 'turn');
      c.turn.append(el('div', 'prompt', e.content));
      c.box.append(c.turn);
      c.step = null;
      c.stepNumber = 0;
      break;
    }
    case 'thinking_chunk': {
      if (!c.thinking) {
        c.thinking = el('details', 'thinking');
        c.thinking.open = true;
        c.thinking.append(el('summary', null, 'reasoning'), el('pre'));
        stepOf(c).append(c.thinking);
      }
      c.thinking.lastChild.append(document.createTextNode(e.content));
      break;
    }
    case 'thinking': {
      if (!c.thinking) {
        c.thinking = el('details', 'thinking');
        c.thinking.append(el('summary'), el('pre'));
        stepOf(c).append(c.thinking);
      }
      c.thinking.firstChild.textContent = `reasoning (${seconds(e.duration_ms / 1000)})`;
      c.thinking.lastChild.textContent = e.content;
      c.thinking.open = false;
      c.thinking = null;
      break;
    }
    case 'text': {
      if (!c.text) {
        c.text = el('div', 'text');
        stepOf(c).append(c.text);
      }
      c.text.append(document.createTextNode(e.content));
      break;
    }
    case 'code': code(c, e); break;
    case 'execution_output': {
      if (!c.live) {
        c.live = el('pre', 'output live');
        stepOf(c).append(c.live);
      }
      c.live.append(document.createTextNode(e.chunk));
      break;
    }
    case 'display': display(c, e); break;
    case 'execution_result': result(c, e); break;
    case 'execution_timeout': {
      if (c.live) c.live.className = 'output failed';
      c.live = null;
      note(c, `the cell ran past its limit of ${e.timeout} s and was stopped` +
        (e.state_lost ? "; the runtime's state was lost" : ''), true);
      break;
    }
    case 'approval_requested': {
      const r = e.request || {};
      note(c, r.kind === 'call' ? `approval asked for the call ${r.function}(${r.arguments})` : 'approval asked for this cell');
      break;
    }
    case 'execution_refused': note(c, 'refused' + (e.reason ? ': ' + e.reason : ''), true); break;
    case 'security_error': {
      const rules = (e.violations || []).map((v) => v.line ? `line ${v.line}: ${v.message}` : v.message);
      note(c, ['refused by the code policy: ' + e.message, ...rules].join('\n'), true);
      break;
    }
    case 'status': status(c, e); break;
    case 'backoff': note(c, `the model call is retried in ${seconds(e.delay)}` + (e.reason ? ` (${e.reason})` : '')); break;
    case 'final_response': {
      // The answer streamed as text: that text becomes the answer, not a copy of it.
      let answer = c.text;
      if (answer && answer.textContent.trim() === String(e.content).trim()) {
        answer.className = 'answer';
        c.text = null;
      } else {
        settle(c, e);
        answer = el('div', 'answer', e.content);
        stepOf(c).append(answer);
      }
      if (typeof e.html === 'string') {
        answer.innerHTML = e.html;
        answer.classList.add('markdown');
      }
      settle(c);
      break;
    }
    case 'step': {
      settle(c, e);
      const cost = [`step ${e.step}`, tokens(e.usage), 'model ' + seconds(e.model_seconds)];
      if (typeof e.execution_seconds === 'number') cost.push('cell ' + seconds(e.execution_seconds));
      stepOf(c).append(el('div', 'cost', cost.join(' · ')));
      c.shown = [];
      c.step = null;
      c.live = null;
      break;
    }
    case 'stopped': {
      settle(c, e);
      const failed = e.stop_reason !== 'completed';
      const line = `${e.stop_reason} after ${e.steps} step${e.steps === 1 ? '' : 's'} in ${seconds(e.elapsed)} · ${tokens(e.usage)}`;
      const box = el('div', failed ? 'stopped failed' : 'stopped', line);
      if (e.error) box.append(el('div', null, `${e.error.kind}: ${e.error.message}`));
      (c.turn || c.box).append(box);
      c.step = null;
      // The session's account so far, in the footer (the session's own runs, not a sub-agent's).
      if (!path.length && typeof e.ledger_line === 'string') {
        footer.textContent = e.ledger_line;
        footer.hidden = false;
      }
      break;
    }
    case 'unreadable': aside(c, `line ${e.line} is not shown: ${e.message}`, true); break;
    default: break; // Readers ignore what they do not know.
  }
}

function connected(state, text) {
  connection.dataset.state = state;
  connection.textContent = text;
}

const source = new EventSource('events');
source.onopen = () => connected('live', 'live');
source.onmessage = (message) => {
  let event;
  try {
    event = JSON.parse(message.data);
  } catch (_) {
    return;
  }
  render(event);
  received += 1;
  document.body.dataset.entries = String(received);
};
source.addEventListener('end', () => {
  source.close();
  connected('ended', 'the session ended');
});
source.onerror = () => {
  connected('lost', source.readyState === EventSource.CLOSED ? 'disconnected' : 'reconnecting…');
};
