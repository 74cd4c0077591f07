// Mints JWTs with Node's own crypto, an implementation independent of the
// gateway's verifier, for the tests of `[auth.oidc]`.
//
// stdin: {"keys": [{"kid", "type": "rsa" | "ec" | "ec384" | "ed25519"}],
//         "tokens": {NAME: {"kid", "alg", "claims": {...}, "header": {...},
//                           "sign": "normal" | "none" | "hs256_public_pem" | "tamper",
//                           "pad": BYTES}}}
// stdout: {"jwks": {KID: public JWK}, "tokens": {NAME: token}}
//
// "header" fields are merged over {"alg", "typ": "JWT", "kid"} (a null drops
// one); "pad" adds a claim of that many bytes; "tamper" signs the claims,
// then swaps in claims naming another user.
import crypto from 'node:crypto';

const input = JSON.parse(await new Promise((resolve) => {
  let text = '';
  process.stdin.on('data', (d) => { text += d; });
  process.stdin.on('end', () => resolve(text));
}));

const b64url = (buf) => Buffer.from(buf).toString('base64url');
const part = (obj) => b64url(JSON.stringify(obj));

const keys = {};
const jwks = {};
for (const { kid, type } of input.keys) {
  const pair = type === 'rsa'
    ? crypto.generateKeyPairSync('rsa', { modulusLength: 2048 })
    : type === 'ec'
      ? crypto.generateKeyPairSync('ec', { namedCurve: 'P-256' })
      : type === 'ec384'
        ? crypto.generateKeyPairSync('ec', { namedCurve: 'P-384' })
        : crypto.generateKeyPairSync('ed25519');
  keys[kid] = pair;
  jwks[kid] = { ...pair.publicKey.export({ format: 'jwk' }), kid, use: 'sig' };
}

function signature(alg, data, pair) {
  const key = pair.privateKey;
  switch (alg) {
    case 'RS256': return crypto.sign('sha256', data, key);
    case 'RS384': return crypto.sign('sha384', data, key);
    case 'PS256':
      return crypto.sign('sha256', data, {
        key, padding: crypto.constants.RSA_PKCS1_PSS_PADDING, saltLength: 32,
      });
    case 'ES256': return crypto.sign('sha256', data, { key, dsaEncoding: 'ieee-p1363' });
    case 'ES384': return crypto.sign('sha384', data, { key, dsaEncoding: 'ieee-p1363' });
    case 'EdDSA': return crypto.sign(null, data, key);
    default: throw new Error(`no signer for ${alg}`);
  }
}

const tokens = {};
for (const [name, spec] of Object.entries(input.tokens)) {
  const header = { alg: spec.alg, typ: 'JWT', kid: spec.kid, ...(spec.header || {}) };
  for (const [k, v] of Object.entries(header)) if (v === null) delete header[k];
  const claims = { ...spec.claims };
  if (spec.pad) claims.pad = 'x'.repeat(spec.pad);
  const signingInput = `${part(header)}.${part(claims)}`;
  const pair = keys[spec.kid];
  let token;
  switch (spec.sign || 'normal') {
    case 'normal':
      token = `${signingInput}.${b64url(signature(spec.alg, signingInput, pair))}`;
      break;
    case 'none':
      token = `${part({ ...header, alg: 'none' })}.${part(claims)}.`;
      break;
    case 'hs256_public_pem': {
      // The classic confusion: the verifier's public key used as an HMAC secret.
      const secret = pair.publicKey.export({ type: 'spki', format: 'pem' });
      const h = `${part({ ...header, alg: 'HS256' })}.${part(claims)}`;
      token = `${h}.${b64url(crypto.createHmac('sha256', secret).update(h).digest())}`;
      break;
    }
    case 'tamper': {
      const sig = b64url(signature(spec.alg, signingInput, pair));
      token = `${part(header)}.${part({ ...claims, sub: 'mallory' })}.${sig}`;
      break;
    }
    default: throw new Error(`unknown sign mode ${spec.sign}`);
  }
  tokens[name] = token;
}

process.stdout.write(JSON.stringify({ jwks, tokens }));
