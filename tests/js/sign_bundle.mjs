// Sign an in-toto statement of cosign's sign predicate over a manifest digest with Sigstore's own
// JavaScript signing library (@sigstore/sign's DSSEBundleBuilder), key-based: the Signer hands the library
// an ECDSA P-256 signature made with the given private key and names the public key; no Fulcio, no Rekor.
//
//   node sign_bundle.mjs PRIVATE_KEY.pem sha256:<hex>   > bundle.json
import { readFileSync } from 'node:fs';
import { createPrivateKey, createPublicKey, sign } from 'node:crypto';
import { bundleToJSON } from '@sigstore/bundle';
import { DSSEBundleBuilder } from '@sigstore/sign';

const [keyPath, digest] = process.argv.slice(2);
const privateKey = createPrivateKey(readFileSync(keyPath));
const publicKey = createPublicKey(privateKey).export({ format: 'pem', type: 'spki' });

const signer = {
  async sign(data) {
    return { signature: sign('sha256', data, privateKey), key: { $case: 'publicKey', publicKey, hint: '' } };
  },
};
const [algorithm, hex] = digest.split(':');
const statement = {
  _type: 'https://in-toto.io/Statement/v1',
  subject: [{ digest: { [algorithm]: hex } }],
  predicateType: 'https://sigstore.dev/cosign/sign/v1',
  predicate: {},
};
const builder = new DSSEBundleBuilder({ signer, witnesses: [] });
const bundle = await builder.create({ data: Buffer.from(JSON.stringify(statement)), type: 'application/vnd.in-toto+json' });
process.stdout.write(JSON.stringify(bundleToJSON(bundle)));
