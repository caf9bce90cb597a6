// A real OpenID provider (panva's oidc-provider) for Marque's tests, on loopback only.
//
// Run: node provider.mjs CONFIG.json   (MARQUE_OIDC_MODULES names the node_modules dir
// scripts/ensure-oidc-provider installed). The tests write CONFIG.json:
//   {issuer, port, clients: [...oidc-provider client metadata], users_file: PATH (a JSON
//    {sub: {email, groups}}, read at every use, so a test may change a user's groups or
//    remove the user while the provider runs), keys: [private JWKs, the first signs],
//    id_token_ttl, clock_offset_seconds, audience_swap: {client_id: other_client_id}}
// Its own sign-in page is oidc-provider's development interaction (any password), and a
// first-party grant is given without a consent screen, so a browser only fills one form.
// `clock_offset_seconds` runs the provider's clock early or late: an issuer whose clock is
// wrong is how a real expired ID token reaches a relying party. `audience_swap` makes the
// token endpoint answer a client with an ID token minted (and signed with the provider's
// key) for another client — what a substituted token looks like to a relying party.
// A client allowed the refresh_token grant gets a refresh token with every code, as
// Keycloak gives one (the default here would need offline_access). The process prints
// "listening <issuer>" once it serves, and exits on SIGTERM.
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const modules = process.env.MARQUE_OIDC_MODULES;
if (!modules) {
  console.error('MARQUE_OIDC_MODULES must name the node_modules oidc-provider is in');
  process.exit(2);
}
const entry = pathToFileURL(path.join(modules, 'oidc-provider', 'lib', 'index.js'));
const { default: Provider } = await import(entry.href);
const jose = await import(pathToFileURL(path.join(modules, 'jose', 'dist', 'webapi',
                                                   'index.js')).href);

if (config.clock_offset_seconds) {
  const realNow = Date.now;
  Date.now = () => realNow() + config.clock_offset_seconds * 1000;
}

const readUsers = () => JSON.parse(readFileSync(config.users_file, 'utf8'));
const provider = new Provider(config.issuer, {
  clients: config.clients,
  jwks: { keys: config.keys },
  findAccount: async (ctx, sub) => {
    const user = readUsers()[sub];
    if (!user) return undefined;
    return {
      accountId: sub,
      claims: async () => ({ sub, email: user.email, email_verified: true,
                             groups: user.groups || [] }),
    };
  },
  claims: { openid: ['sub'], email: ['email', 'email_verified'], groups: ['groups'] },
  scopes: ['openid', 'email', 'groups', 'offline_access'],
  pkce: { required: () => true },
  issueRefreshToken: async (ctx, client) => client.grantTypeAllowed('refresh_token'),
  features: {
    devInteractions: { enabled: true },
    deviceFlow: { enabled: true },
    backchannelLogout: { enabled: true },
    rpInitiatedLogout: { enabled: true },
    revocation: { enabled: true },
  },
  ttl: {
    IdToken: config.id_token_ttl || 300,
    AccessToken: 300,
    DeviceCode: 300,
    Interaction: 600,
    Session: 3600,
    Grant: 3600,
  },
  cookies: { keys: ['marque-test-provider-cookie-key-0123456789'] },
  // The provider refuses to call special-use addresses (its SSRF guard); the relying party
  // under test listens on loopback, so calls to 127.0.0.1 (back-channel logout) go out
  // without that guard, and every other call keeps it.
  fetch: (url, options) => {
    if (new URL(url).hostname === '127.0.0.1') {
      const { dispatcher, ...rest } = options;
      return globalThis.fetch(url, rest);
    }
    return globalThis.fetch(url, options);
  },
  // First-party clients only: grant what was asked, with no consent screen.
  loadExistingGrant: async (ctx) => {
    const grantId = ctx.oidc.result?.consent?.grantId
      || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    if (grantId) return ctx.oidc.provider.Grant.find(grantId);
    const grant = new ctx.oidc.provider.Grant({
      clientId: ctx.oidc.client.clientId, accountId: ctx.oidc.session.accountId });
    grant.addOIDCScope('openid email groups offline_access');
    grant.addOIDCClaims(['email', 'email_verified', 'groups']);
    await grant.save();
    return grant;
  },
});
provider.proxy = false;
// The token endpoint's answer to a client named in `audience_swap`: its ID token re-minted
// for the other client (the same claims, the provider's signing key).
const swaps = config.audience_swap || {};
provider.use(async (ctx, next) => {
  await next();
  const other = swaps[ctx.oidc?.client?.clientId];
  if (ctx.oidc?.route !== 'token' || !other || typeof ctx.body?.id_token !== 'string') return;
  const claims = jose.decodeJwt(ctx.body.id_token);
  const signer = config.keys[0];
  const key = await jose.importJWK(signer, 'RS256');
  ctx.body = { ...ctx.body, id_token: await new jose.SignJWT({ ...claims, aud: other,
                                                               azp: other })
    .setProtectedHeader({ alg: 'RS256', kid: signer.kid }).sign(key) };
});
// What the provider did that a test may need to read afterwards, on stderr.
provider.on('backchannel.success', () => console.error('backchannel.success'));
provider.on('backchannel.error', (ctx, err, client) => console.error(
  `backchannel.error ${client?.clientId} ${err?.message} ${err?.cause}`));
provider.on('server_error', (ctx, err) => console.error(`server_error ${err?.stack}`));
provider.on('grant.success', (ctx) => console.error(
  `grant.success ${ctx.oidc.params?.grant_type} ${ctx.oidc.client?.clientId}`));
provider.on('end_session.success', () => console.error('end_session.success'));

const server = provider.listen(config.port, '127.0.0.1', () => {
  console.log(`listening ${config.issuer}`);
});
process.on('SIGTERM', () => server.close(() => process.exit(0)));
