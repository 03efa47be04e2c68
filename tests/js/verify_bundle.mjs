// Verify a key-signed Sigstore bundle with Sigstore's own JavaScript verifier (@sigstore/verify), offline:
// an empty trusted root, a key finder that returns the given public key, no transparency log entries or
// timestamps required. Then check what the DSSE envelope signs: an in-toto Statement v1 whose one subject
// has the expected sha256 digest (and, when given, the expected predicateType).
//
//   node verify_bundle.mjs BUNDLE.json PUBLIC_KEY.pem sha256:<hex> [PREDICATE_TYPE]
//
// Prints "verified" and exits 0, or prints the reason on stderr and exits 1.
import { readFileSync } from 'node:fs';
import { createPublicKey } from 'node:crypto';
import { bundleFromJSON } from '@sigstore/bundle';
import { Verifier, toSignedEntity, toTrustMaterial } from '@sigstore/verify';

const [bundlePath, keyPath, expectedDigest, expectedPredicate] = process.argv.slice(2);
try {
  const bundle = bundleFromJSON(JSON.parse(readFileSync(bundlePath, 'utf8')));
  const publicKey = createPublicKey(readFileSync(keyPath));
  const emptyRoot = { mediaType: '', certificateAuthorities: [], ctlogs: [], tlogs: [], timestampAuthorities: [] };
  const trust = toTrustMaterial(emptyRoot, () => ({ publicKey, validFor: () => true }));
  const verifier = new Verifier(trust, { tlogThreshold: 0, ctlogThreshold: 0, timestampThreshold: 0 });
  verifier.verify(toSignedEntity(bundle));

  const envelope = bundle.content.dsseEnvelope;
  if (!envelope) throw new Error('bundle holds no DSSE envelope');
  const statement = JSON.parse(envelope.payload.toString('utf8'));
  if (statement._type !== 'https://in-toto.io/Statement/v1') throw new Error(`not an in-toto Statement v1: ${statement._type}`);
  if (expectedPredicate && statement.predicateType !== expectedPredicate) {
    throw new Error(`predicateType is ${statement.predicateType}, expected ${expectedPredicate}`);
  }
  const subjects = statement.subject || [];
  const [algorithm, hex] = expectedDigest.split(':');
  if (subjects.length !== 1 || subjects[0].digest?.[algorithm] !== hex) {
    throw new Error(`subject digest is ${JSON.stringify(subjects.map((s) => s.digest))}, expected ${expectedDigest}`);
  }
  console.log('verified');
} catch (err) {
  console.error(`not verified: ${err.message}`);
  process.exit(1);
}
