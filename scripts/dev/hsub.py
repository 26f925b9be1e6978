import sys, json, struct, numpy as np
from safetensors.numpy import load_file, save_file
src,dst=sys.argv[1],sys.argv[2]; L=set(sys.argv[3].split(','))
f=open(src,'rb'); n=struct.unpack('<Q',f.read(8))[0]; meta=json.loads(f.read(n))['__metadata__']
H=load_file(src)
out={k:v for k,v in H.items() if k.split('.')[1] in L}
meta={k:v for k,v in meta.items() if not k.startswith('tokens:') or k.split(':')[1].split('.')[1] in L}
save_file(out,dst,metadata=meta)
