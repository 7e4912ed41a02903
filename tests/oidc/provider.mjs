// A real OpenID provider for the tests: node-oidc-provider (OpenID Certified), configured from
// a JSON file that tests/oidckit.py writes. Usage: node provider.mjs CONFIG.json
//
// - the config names the oidc-provider package dir (`module`), the clients, the files of the
//   accounts (re-read at every lookup: a test changes a user's groups by rewriting it), the
//   signing keys (private JWKs) and a request log;
// - listens on 127.0.0.1, port 0 unless the config names one, and prints one JSON line
//   {"port": N} when it serves; the issuer is http://127.0.0.1:N;
// - SIGHUP re-reads the config and the keys and swaps in a new provider (key rotation, a new
//   redirect URI); its sessions and grants live in the memory adapter, which every provider of
//   this process shares. GET /__generation answers how many times it has (re)loaded;
// - its own two-page login (GET /interaction/:uid, POST /interaction/:uid/login with `login`
//   and `password`), no consent for the test clients (their grants are made on the fly), and
//   RP-initiated logout with a plain confirm form. No page loads anything from elsewhere.
import { appendFileSync, readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const configPath = process.argv[2];
const readJson = (path) => JSON.parse(readFileSync(path, 'utf8'));
let config = readJson(configPath);
const { default: Provider } = await import(pathToFileURL(join(config.module, 'lib', 'index.js')).href);

const esc = (s) => String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
const page = (title, body) => `<!doctype html><html><head><meta charset="utf-8"><title>${esc(title)}</title></head>`
  + `<body><h1>${esc(title)}</h1>${body}</body></html>`;

function accounts() {
  return readJson(config.accounts_file);
}

async function findAccount(ctx, id) {
  const account = accounts()[id];
  if (!account) return undefined;
  return {
    accountId: id,
    async claims() { return { ...(account.claims || {}), sub: id }; },
  };
}

function makeProvider(issuer) {
  const provider = new Provider(issuer, {
    clients: config.clients.map((c) => ({
      response_types: ['code'], grant_types: ['authorization_code'],
      token_endpoint_auth_method: 'client_secret_basic', ...c,
    })),
    jwks: readJson(config.keys_file),
    findAccount,
    claims: {
      openid: ['sub'], profile: ['preferred_username', 'name', 'username'], email: ['email'], groups: ['groups'],
    },
    scopes: ['openid', 'profile', 'email', 'groups'],
    // the scopes' claims go into the ID token (as Keycloak and Entra ID do), unless the config says
    // claims_in_id_token: false (then they come from userinfo only, as the spec's default has it)
    conformIdTokenClaims: config.claims_in_id_token === false,
    cookies: { keys: config.cookie_keys },
    pkce: { required: () => true },
    features: {
      devInteractions: { enabled: false },
      rpInitiatedLogout: {
        enabled: true,
        logoutSource: async (ctx, form) => {
          ctx.body = page('Sign out of the test provider',
            `${form}<button id="op-logout" type="submit" form="op.logoutForm" name="logout" value="yes">Yes, sign me out</button>`);
        },
        postLogoutSuccessSource: async (ctx) => { ctx.body = page('Signed out', '<p>You are signed out.</p>'); },
      },
    },
    interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
    async loadExistingGrant(ctx) {
      const grant = new ctx.oidc.provider.Grant({ clientId: ctx.oidc.client.clientId, accountId: ctx.oidc.session.accountId });
      grant.addOIDCScope(ctx.oidc.params?.scope || 'openid');
      await grant.save();
      return grant;
    },
    ttl: { IdToken: 3600, AccessToken: 3600, Interaction: 600, Session: 3600, Grant: 3600, AuthorizationCode: 60 },
    renderError: async (ctx, out) => {
      ctx.type = 'html';
      ctx.body = page('Provider error', `<p id="op-error">${esc(out.error)}: ${esc(out.error_description || '')}</p>`);
    },
  });
  provider.proxy = false;
  return provider;
}

function formBody(req) {
  return new Promise((resolve, reject) => {
    let data = '';
    req.on('data', (chunk) => { data += chunk; });
    req.on('end', () => resolve(Object.fromEntries(new URLSearchParams(data))));
    req.on('error', reject);
  });
}

const loginForm = (uid, message = '') => page('Sign in to the test provider',
  `${message ? `<p id="op-login-error">${esc(message)}</p>` : ''}`
  + `<form method="post" action="/interaction/${esc(uid)}/login">`
  + '<label>User <input id="op-login" name="login" autocomplete="off"></label>'
  + '<label>Password <input id="op-password" name="password" type="password"></label>'
  + '<button id="op-submit" type="submit">Sign in</button></form>');

async function interaction(req, res, provider, path) {
  const [, , uid, action] = path.split('/');
  const details = await provider.interactionDetails(req, res);
  if (details.uid !== uid) throw new Error('interaction mismatch');
  if (req.method === 'GET' && !action) {
    res.setHeader('Content-Type', 'text/html');
    res.end(details.prompt.name === 'login' ? loginForm(uid) : page('Unexpected prompt', details.prompt.name));
    return;
  }
  if (req.method === 'POST' && action === 'login') {
    const { login, password } = await formBody(req);
    const account = accounts()[login];
    if (!account || account.password !== password) {
      res.statusCode = 401;
      res.setHeader('Content-Type', 'text/html');
      res.end(loginForm(uid, 'Unknown user or wrong password.'));
      return;
    }
    await provider.interactionFinished(req, res, { login: { accountId: login } }, { mergeWithLastSubmission: false });
    return;
  }
  res.statusCode = 404;
  res.end('not found');
}

let provider;
let handler;
let generation = 0;
function load(issuer) {
  provider = makeProvider(issuer);
  handler = provider.callback();
  generation += 1;
}

const server = createServer((req, res) => {
  const path = new URL(req.url, 'http://x').pathname;
  if (config.log_file) appendFileSync(config.log_file, `${req.method} ${req.url}\n`);
  if (path === '/__generation') {
    res.setHeader('Content-Type', 'application/json');
    res.end(JSON.stringify({ generation }));
    return;
  }
  if (path.startsWith('/interaction/')) {
    interaction(req, res, provider, path).catch((err) => {
      res.statusCode = 400;
      res.setHeader('Content-Type', 'text/html');
      res.end(page('Interaction failed', `<p id="op-error">${esc(err.message)}</p>`));
    });
    return;
  }
  handler(req, res);
});

server.listen(config.port || 0, '127.0.0.1', () => {
  const { port } = server.address();
  const issuer = `http://127.0.0.1:${port}`;
  load(issuer);
  process.on('SIGHUP', () => {
    try {
      config = readJson(configPath);
      load(issuer);
    } catch (err) {
      process.stderr.write(`reload failed: ${err.stack}\n`);
    }
  });
  process.on('SIGTERM', () => server.close(() => process.exit(0)));
  process.stdout.write(`${JSON.stringify({ port, issuer })}\n`);
});
