// A real OpenID Provider (oidc-provider, certified) for the single sign-on tests and for
// `SAGA_DEMO_SSO=1 make run`. Configured by the environment:
//   OIDC_PEER_HOST, OIDC_PEER_PORT       where to listen (port 0: any free port)
//   OIDC_PEER_CLIENT_ID, OIDC_PEER_CLIENT_SECRET, OIDC_PEER_REDIRECT_URIS (comma-separated)
//                                        the one client: Saga Admin's web server
//   OIDC_PEER_ACCOUNTS                   a JSON file {"login": {"email": ..., "groups": [...]}},
//                                        read again at every lookup, so a test changes a
//                                        person's groups between two sign-ins by rewriting it
// Sign-in is the provider's own login and consent pages (its development interactions: any
// password is accepted for a login the accounts file names; other logins cannot finish).
// Storage is the library's in-memory adapter; the signing key is made at start.
// Prints one JSON line {"issuer": ...} once it listens.
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';

import Provider from 'oidc-provider';

const env = process.env;
const host = env.OIDC_PEER_HOST || '127.0.0.1';
const port = Number(env.OIDC_PEER_PORT || 0);
const accountsFile = env.OIDC_PEER_ACCOUNTS;
if (!accountsFile || !env.OIDC_PEER_CLIENT_ID || !env.OIDC_PEER_CLIENT_SECRET || !env.OIDC_PEER_REDIRECT_URIS) {
  console.error('OIDC_PEER_ACCOUNTS, OIDC_PEER_CLIENT_ID, OIDC_PEER_CLIENT_SECRET and OIDC_PEER_REDIRECT_URIS are required');
  process.exit(2);
}

function accounts() {
  return JSON.parse(readFileSync(accountsFile, 'utf8'));
}

const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
const signingKey = { ...privateKey.export({ format: 'jwk' }), kid: `peer-${randomBytes(4).toString('hex')}`, use: 'sig', alg: 'RS256' };

const server = createServer();
server.listen(port, host, () => {
  const address = server.address();
  const issuer = `http://${host}:${address.port}`;
  const provider = new Provider(issuer, {
    clients: [
      {
        client_id: env.OIDC_PEER_CLIENT_ID,
        client_secret: env.OIDC_PEER_CLIENT_SECRET,
        redirect_uris: env.OIDC_PEER_REDIRECT_URIS.split(',').map((uri) => uri.trim()).filter(Boolean),
        grant_types: ['authorization_code'],
        response_types: ['code'],
        token_endpoint_auth_method: 'client_secret_basic',
      },
    ],
    jwks: { keys: [signingKey] },
    cookies: { keys: [randomBytes(32).toString('hex')] },
    pkce: { required: () => true },
    claims: {
      openid: ['sub'],
      email: ['email', 'email_verified'],
      profile: ['name', 'given_name', 'family_name', 'preferred_username'],
      groups: ['groups'],
    },
    scopes: ['openid', 'offline_access', 'email', 'profile', 'groups'],
    features: { devInteractions: { enabled: true } },
    async findAccount(_ctx, id) {
      if (!Object.hasOwn(accounts(), id)) {
        return undefined;
      }
      return {
        accountId: id,
        async claims() {
          return { ...(accounts()[id] || {}), sub: id };
        },
      };
    },
  });
  server.on('request', provider.callback());
  process.stdout.write(`${JSON.stringify({ issuer })}\n`);
});

for (const signal of ['SIGTERM', 'SIGINT']) {
  process.on(signal, () => server.close(() => process.exit(0)));
}
