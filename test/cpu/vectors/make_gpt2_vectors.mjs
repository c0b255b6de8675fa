// Generates test/cpu/vectors/gpt2_encode.tsv: the ids GPT-2's tokenizer gives for a set of diverse strings,
// taken from js-tiktoken (a port of OpenAI's tiktoken; its "gpt2" encoding is GPT-2's encoder.json + vocab.bpe).
// Regenerate (needs the npm registry; never commit node_modules):
//   cd /tmp && npm install js-tiktoken@1.0.21 && cp <repo>/test/cpu/vectors/make_gpt2_vectors.mjs . \
//     && node make_gpt2_vectors.mjs > <repo>/test/cpu/vectors/gpt2_encode.tsv
import { getEncoding } from "js-tiktoken";
const enc = getEncoding("gpt2");
const cases = [
  ["Hello, world!", 0],
  ["First Citizen:\nBefore we proceed any further, hear me speak.", 0],
  ["Café naïve façade résumé über Ångström", 0],
  ["日本語のテキストと中文字符，还有한국어.", 0],
  ["Привет, мир! Съешь же ещё этих мягких французских булок.", 0],
  ["I ❤️ 🍕 and 👩‍👩‍👧‍👦 families 🚀🚀", 0],
  ["\tcol1\tcol2\t\tcol4\n", 0],
  ["a    b     c      d", 0],
  ["end with spaces   ", 0],
  ["   leading", 0],
  ["line1\n\n\nline2\r\nline3\n", 0],
  ["I'm sure you'll see they've done it, haven't they? We'd, I'd, it's.", 0],
  ["DON'T YOU'LL WE'RE", 0],
  ["In 1984, 3.14159 and 1,000,000 people paid $42.50 (or 10%).", 0],
  ["12345678901234567890", 0],
  ["x=3; y = x**2 + 1e-5 // comment", 0],
  ["def f(x):\n    return x + 1\n", 0],
  ["!!!??? ... --- ***", 0],
  ["Γειά σου Κόσμε", 0],
  ["مرحبا بالعالم", 0],
  ["नमस्ते दुनिया", 0],
  [" \t \n  x", 0],
  ["a\u00a0b \u3000c", 0],
  ["a\u200db", 0],
  ["e\u0301 cafe\u0301", 0],
  ["²³ Ⅻ ½ ٣٤", 0],
  ["", 0],
  [" ", 0],
  ["\n\n", 0],
  ["KING RICHARD III:\nWhat, ho! 'Tis thou, 'twas he.", 0],
  ["Hello  world", 0],
  ["https://example.com/path?q=1&x=ünï", 0],
  ["∑∫√∞ ≤ ≥", 0],
  ["ﬁ ligature and ＦＵＬＬＷＩＤＴＨ", 0],
  ["the <|endoftext|> marker as plain text", 0],
  ["x\u180e. a\u180e\n\nb \u2028 \u205f!", 0],
  ["Hello<|endoftext|>World", 1],
  ["<|endoftext|>First Citizen:\n<|endoftext|><|endoftext|>", 1],
];
const hex = (s) => Buffer.from(s, "utf8").toString("hex");
let out =
  "# GPT-2 BPE test vectors, made by test/cpu/vectors/make_gpt2_vectors.mjs with js-tiktoken 1.0.21 (encoding \"gpt2\").\n" +
  "# Columns (tab-separated): text as UTF-8 hex | allow_special (1: <|endoftext|> is the special token 50256) | ids | text as JSON (to read).\n";
for (const [text, special] of cases) {
  const ids = special ? enc.encode(text, "all") : enc.encode(text, [], []);
  out += `${hex(text)}\t${special}\t${ids.join(" ")}\t${JSON.stringify(text)}\n`;
}
process.stdout.write(out);
